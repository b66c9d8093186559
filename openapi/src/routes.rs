//! Every HTTP route Moongate serves, declared once: method, path, operation id, the plane
//! (which key it takes), the request body, query and the success body. The servers read
//! their routes' paths and operation ids from here (`#[utoipa::path(path = X::PATH,
//! operation_id = X::OPERATION_ID)]`), the store client builds its calls from the same
//! declarations ([`Endpoint`]: the path, the method, the plane, and the body and answer
//! types), and a test checks that the document the servers serve says the same as this
//! module, route for route (`tests/tests/routes.rs`).
//!
//! Paths are OpenAPI templates (`/api/v1/objects/{key}/put-start`), which is also axum's
//! syntax; [`Route::fill`] puts percent-encoded values into them.
//!
//! # Layout
//! - [`gateway`]: `moongate serve`'s own routes: inference, the worker API, health.
//! - [`master`]: the KV master's REST API and transfer-metadata store, served by `moongate
//!   serve` (unless `--disable-master`) and by `moongate master`.
//! - [`master_ops`]: `moongate master`'s own health and metrics routes.
//! - [`node`]: a storage node's (`moongate store`) routes.
//! - [`docs`]: the OpenAPI document and Swagger UI, on every server with a document.

use std::fmt::Write as _;

/// An HTTP method of a declared route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `PATCH`.
    Patch,
    /// `DELETE`.
    Delete,
}

impl Method {
    /// The method's name, upper case (`GET`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }
}

/// Which key a route takes (the planes of the security model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    /// No key: probes, metrics, the API documents.
    Open,
    /// Inference: a client key when the server has client keys, else open.
    Client,
    /// The KV master's store plane: the store key (storage nodes and store clients).
    Store,
    /// The worker API and the master's admin plane: the admin key, or loopback callers
    /// of a server without one.
    Admin,
}

impl Plane {
    /// `open`, `client`, `store` or `admin` (the document's `x-moongate-plane`, metric
    /// labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Client => "client",
            Self::Store => "store",
            Self::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Plane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One declared route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Its method.
    pub method: Method,
    /// Its path, an OpenAPI template (`{name}` marks a path parameter).
    pub path: &'static str,
    /// The document's `operationId`.
    pub operation_id: &'static str,
    /// Which key it takes.
    pub plane: Plane,
    /// The schema name of its JSON request body (`None`: no body, or not JSON).
    pub body: Option<&'static str>,
    /// The schema name of its query parameters' struct (`None`: no query).
    pub query: Option<&'static str>,
    /// The schema name of its success answer (`None`: empty, streamed, or plain text).
    pub response: Option<&'static str>,
}

impl Route {
    /// Appends the path with its parameters (in order) filled in, each percent-encoded as
    /// one path segment (`/` in a key is `%2F`).
    pub fn fill(&self, out: &mut String, params: &[&str]) {
        let mut params = params.iter();
        let mut rest = self.path;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let close = rest[open..].find('}').map_or(rest.len(), |c| open + c + 1);
            if let Some(p) = params.next() {
                push_segment(out, p);
            }
            rest = &rest[close..];
        }
        out.push_str(rest);
    }

    /// How many path parameters the path has.
    pub fn params(&self) -> usize {
        self.path.matches('{').count()
    }

    /// Whether a request `method path` (the path without its query) is this route: the
    /// same segments, a `{param}` standing for any one non-empty segment.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        if !method.eq_ignore_ascii_case(self.method.as_str()) {
            return false;
        }
        let mut want = self.path.split('/');
        let mut got = path.split('/');
        loop {
            match (want.next(), got.next()) {
                (None, None) => return true,
                (Some(w), Some(g)) if w.starts_with('{') && !g.is_empty() => {}
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

/// The operation id of the route among `routes` that `method path` is (see
/// [`Route::matches`]): a name for the request without its parameters (keys stay out of
/// span names and labels).
pub fn operation_of(routes: &[Route], method: &str, path: &str) -> Option<&'static str> {
    routes
        .iter()
        .find(|r| r.matches(method, path))
        .map(|r| r.operation_id)
}

/// Appends `s` percent-encoded as one path segment (RFC 3986 unreserved bytes kept).
pub fn push_segment(out: &mut String, s: &str) {
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

/// A declared route with its types: what a typed client sends and gets back.
pub trait Endpoint {
    /// The route.
    const ROUTE: Route;
    /// The JSON request body (`()`: none).
    type Body;
    /// The query parameters (`()`: none).
    type Query;
    /// The success answer (`()`: empty).
    type Response;
}

/// The schema name a declared type gives the document (`None` for `()` and text).
macro_rules! schema_name {
    (()) => {
        None
    };
    (String) => {
        None
    };
    ($t:ident) => {
        Some(stringify!($t))
    };
}

/// Declares routes (`Name = Method "path", Plane, "operation_id", Body [with Query] =>
/// Response;`): a marker type per route implementing [`Endpoint`], with `PATH` and
/// `OPERATION_ID` consts for the servers' `#[utoipa::path]` attributes, and `ALL`, every
/// route of the module.
macro_rules! routes {
    (@query) => { () };
    (@query $q:ident) => { $q };
    (@query_name) => { None };
    (@query_name $q:ident) => { Some(stringify!($q)) };
    ($(
        $(#[$doc:meta])*
        $name:ident = $method:ident $path:literal, $plane:ident, $op:literal,
            $body:tt $(with $query:ident)? => $resp:tt;
    )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl $name {
                /// The route's path.
                pub const PATH: &'static str = $path;
                /// The route's operation id.
                pub const OPERATION_ID: &'static str = $op;
            }

            impl $crate::routes::Endpoint for $name {
                const ROUTE: $crate::routes::Route = $crate::routes::Route {
                    method: $crate::routes::Method::$method,
                    path: $path,
                    operation_id: $op,
                    plane: $crate::routes::Plane::$plane,
                    body: schema_name!($body),
                    query: routes!(@query_name $($query)?),
                    response: schema_name!($resp),
                };
                type Body = $body;
                type Query = routes!(@query $($query)?);
                type Response = $resp;
            }
        )*

        /// Every route declared here.
        pub const ALL: &[$crate::routes::Route] = &[$(<$name as $crate::routes::Endpoint>::ROUTE),*];
    };
}

/// `moongate serve`'s own routes.
pub mod gateway {
    use crate::console::ClusterView;
    use crate::openai::ModelList;
    use crate::openai::chat::{ChatCompletionRequest, ChatCompletionResponse};
    use crate::openai::completions::{CompletionRequest, CompletionResponse};
    use crate::openai::embeddings::{EmbeddingRequest, EmbeddingResponse};
    use crate::openai::pooling::{ClassifyRequest, ClassifyResponse, ScoreRequest, ScoreResponse};
    use crate::openai::rerank::{RerankRequest, RerankResponse};
    use crate::openai::responses::{ResponseInputItems, ResponseObject, ResponsesRequest};
    use crate::openai::tokenize::{
        DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
    };
    use crate::sglang::GenerateRequest;
    use crate::sglang::server::{ModelInfo, ServerInfo};
    use crate::workers::{
        CreateWorkerRequest, FlushCacheResult, HealthStatus, ProfileRequest, ProfileResult,
        UpdateWorkerRequest, WorkerInfo, WorkerList, WorkerLoads,
    };

    routes! {
        /// OpenAI chat completions, proxied to a worker (JSON or SSE).
        ChatCompletions = Post "/v1/chat/completions", Client, "chat_completions",
            ChatCompletionRequest => ChatCompletionResponse;
        /// OpenAI text completions, proxied.
        Completions = Post "/v1/completions", Client, "completions",
            CompletionRequest => CompletionResponse;
        /// OpenAI embeddings, proxied to a worker serving an embedding model (regular mode).
        Embeddings = Post "/v1/embeddings", Client, "embeddings",
            EmbeddingRequest => EmbeddingResponse;
        /// Rerank in the router's form, sent to a worker's `/v1/rerank`.
        Rerank = Post "/rerank", Client, "rerank", RerankRequest => RerankResponse;
        /// Rerank in SGLang's form, answered in the router's.
        V1Rerank = Post "/v1/rerank", Client, "v1_rerank", RerankRequest => RerankResponse;
        /// Classification by a classifier model, proxied (regular mode).
        Classify = Post "/v1/classify", Client, "classify", ClassifyRequest => ClassifyResponse;
        /// Label-token scores of query + items, proxied (regular mode).
        Score = Post "/v1/score", Client, "score", ScoreRequest => ScoreResponse;
        /// The model's tokenizer, on a worker.
        Tokenize = Post "/v1/tokenize", Client, "tokenize", TokenizeRequest => TokenizeResponse;
        /// The model's detokenizer, on a worker.
        Detokenize = Post "/v1/detokenize", Client, "detokenize",
            DetokenizeRequest => DetokenizeResponse;
        /// A response (Responses API), made by a worker that keeps it (regular mode).
        Responses = Post "/v1/responses", Client, "create_response",
            ResponsesRequest => ResponseObject;
        /// A response, from the worker holding it.
        GetResponse = Get "/v1/responses/{response_id}", Client, "get_response",
            () => ResponseObject;
        /// Deletes a response on the worker holding it.
        DeleteResponse = Delete "/v1/responses/{response_id}", Client, "delete_response",
            () => ();
        /// Cancels a background response on the worker holding it.
        CancelResponse = Post "/v1/responses/{response_id}/cancel", Client, "cancel_response",
            () => ResponseObject;
        /// The input items of a response, from the worker holding it.
        ResponseInputItemsRoute = Get "/v1/responses/{response_id}/input_items", Client,
            "list_response_input_items", () => ResponseInputItems;
        /// SGLang's native generation, proxied (its answer is a worker's, streamed or not).
        Generate = Post "/generate", Client, "generate", GenerateRequest => ();
        /// The models the ready workers serve.
        Models = Get "/v1/models", Client, "models", () => ModelList;
        /// A worker's `/get_server_info`.
        ServerInfoRoute = Get "/get_server_info", Client, "server_info", () => ServerInfo;
        /// A worker's `/get_model_info`.
        ModelInfoRoute = Get "/get_model_info", Client, "model_info", () => ModelInfo;
        /// Every worker.
        ListWorkers = Get "/workers", Admin, "list_workers", () => WorkerList;
        /// Adds a worker.
        CreateWorker = Post "/workers", Admin, "create_worker",
            CreateWorkerRequest => WorkerInfo;
        /// One worker.
        GetWorker = Get "/workers/{id}", Admin, "get_worker", () => WorkerInfo;
        /// Changes a worker's settings.
        UpdateWorker = Patch "/workers/{id}", Admin, "update_worker",
            UpdateWorkerRequest => WorkerInfo;
        /// Drains and removes a worker.
        DeleteWorker = Delete "/workers/{id}", Admin, "delete_worker", () => WorkerInfo;
        /// The process is up.
        Health = Get "/health", Open, "health", () => HealthStatus;
        /// The liveness probe.
        Liveness = Get "/liveness", Open, "liveness", () => HealthStatus;
        /// The readiness probe: a worker is ready.
        Readiness = Get "/readiness", Open, "readiness", () => HealthStatus;
        /// Prometheus text exposition.
        Metrics = Get "/metrics", Open, "metrics", () => String;
        /// One short generation on a ready worker (PD: on a prefill and a decode worker).
        HealthGenerate = Get "/health_generate", Client, "health_generate", () => String;
        /// Flushes every worker's prefix cache.
        FlushCache = Post "/flush_cache", Admin, "flush_cache", () => FlushCacheResult;
        /// Every worker's load, per data-parallel rank.
        GetLoads = Get "/get_loads", Admin, "get_loads", () => WorkerLoads;
        /// The workers' own Prometheus metrics, merged, each sample labelled with its worker.
        EngineMetrics = Get "/engine_metrics", Admin, "engine_metrics", () => String;
        /// Starts SGLang's profiler on every worker (or the one `url` names).
        StartProfile = Post "/start_profile", Admin, "start_profile",
            ProfileRequest => ProfileResult;
        /// Stops it.
        StopProfile = Post "/stop_profile", Admin, "stop_profile",
            ProfileRequest => ProfileResult;
        /// The cluster at a glance: the gateway, its workers, its routing decisions, the
        /// KV master it hosts.
        Cluster = Get "/cluster", Admin, "cluster", () => ClusterView;
        /// The console: a page that draws `/cluster` and refreshes it (it holds no data
        /// itself; its reads take the admin key).
        Console = Get "/console", Open, "console", () => String;
    }
}

/// The KV master's REST API (`/api/v1/...`) and transfer-metadata store (`/metadata`).
pub mod master {
    use crate::master::{
        BatchClientKeysRequest, BatchExistsResponse, BatchKeyResponse, BatchKeysRequest,
        BatchPutCommitRequest, BatchPutCommitResponse, BatchPutStartRequest, BatchPutStartResponse,
        BatchRemoveRequest, BatchReplicasResponse, Client, ClientList, ClientRequest,
        DeleteObjectsQuery, EventsQuery, ExistsResponse, HaStatus, KeyPage, ListObjectsQuery,
        MasterStats, MetadataQuery, ObjectInfo, PingResponse, PutStartRequest, PutStartResponse,
        RemountRequest, RemoveQuery, RemovedResponse, ReplicaClearRequest, ReplicaClearResponse,
        ReplicasQuery, ReplicasResponse, Segment, SegmentList, SegmentSpec, StoreEvents,
        TierExchange, TierTasks,
    };

    routes! {
        /// Mounts a segment of the client's memory.
        MountSegment = Post "/api/v1/clients/{client_id}/segments", Store,
            "master_mount_segment", SegmentSpec => Segment;
        /// Mounts again every segment of a client the master asked to remount.
        Remount = Post "/api/v1/clients/{client_id}/remount", Store, "master_remount",
            RemountRequest => Client;
        /// Unmounts one segment.
        UnmountSegment = Delete "/api/v1/clients/{client_id}/segments/{name}", Store,
            "master_unmount_segment", () => ();
        /// The client's heartbeat.
        Ping = Post "/api/v1/clients/{client_id}/ping", Store, "master_ping",
            () => PingResponse;
        /// Every client (admin).
        ListClients = Get "/api/v1/clients", Admin, "master_list_clients", () => ClientList;
        /// One client (admin).
        GetClient = Get "/api/v1/clients/{client_id}", Admin, "master_get_client",
            () => Client;
        /// A client leaves: its segments are unmounted.
        RemoveClient = Delete "/api/v1/clients/{client_id}", Store, "master_remove_client",
            () => ();
        /// Every segment (admin).
        ListSegments = Get "/api/v1/segments", Admin, "master_list_segments",
            () => SegmentList;
        /// One segment (admin).
        GetSegment = Get "/api/v1/segments/{name}", Admin, "master_get_segment",
            () => Segment;
        /// The master's totals (admin).
        Stats = Get "/api/v1/stats", Admin, "master_stats", () => MasterStats;
        /// Starts a put: the master allocates the replicas.
        PutStart = Post "/api/v1/objects/{key}/put-start", Store, "master_put_start",
            PutStartRequest => PutStartResponse;
        /// Ends a put: the object turns readable.
        PutEnd = Post "/api/v1/objects/{key}/put-end", Store, "master_put_end",
            ClientRequest => ();
        /// Revokes a put that failed.
        PutRevoke = Post "/api/v1/objects/{key}/put-revoke", Store, "master_put_revoke",
            ClientRequest => ();
        /// An object's replicas, with a read lease.
        GetReplicas = Get "/api/v1/objects/{key}/replicas", Store, "master_get_replicas",
            () with ReplicasQuery => ReplicasResponse;
        /// Whether an object exists (complete).
        Exists = Get "/api/v1/objects/{key}/exists", Store, "master_exists",
            () => ExistsResponse;
        /// One object's metadata (admin).
        GetObject = Get "/api/v1/objects/{key}", Admin, "master_get_object", () => ObjectInfo;
        /// Removes an object.
        Remove = Delete "/api/v1/objects/{key}", Store, "master_remove",
            () with RemoveQuery => RemovedResponse;
        /// Object keys, a page at a time (admin).
        ListObjects = Get "/api/v1/objects", Admin, "master_list_objects",
            () with ListObjectsQuery => KeyPage;
        /// Removes every object, or those whose key matches a regex (admin).
        RemoveObjects = Delete "/api/v1/objects", Admin, "master_remove_objects",
            () with DeleteObjectsQuery => RemovedResponse;
        /// Starts puts of many objects.
        BatchPutStart = Post "/api/v1/batch/put-start", Store, "master_batch_put_start",
            BatchPutStartRequest => BatchPutStartResponse;
        /// Commits values written into reservations.
        BatchPutCommit = Post "/api/v1/batch/put-commit", Store, "master_batch_put_commit",
            BatchPutCommitRequest => BatchPutCommitResponse;
        /// Ends many puts.
        BatchPutEnd = Post "/api/v1/batch/put-end", Store, "master_batch_put_end",
            BatchClientKeysRequest => BatchKeyResponse;
        /// Revokes many puts.
        BatchPutRevoke = Post "/api/v1/batch/put-revoke", Store, "master_batch_put_revoke",
            BatchClientKeysRequest => BatchKeyResponse;
        /// The replicas of many objects, with read leases.
        BatchGetReplicas = Post "/api/v1/batch/replicas", Store, "master_batch_get_replicas",
            BatchKeysRequest with ReplicasQuery => BatchReplicasResponse;
        /// The replicas of many objects as they lie, memory and disk, without a lease and
        /// without reading anything back from disk (Mooncake's replica descriptions).
        BatchReplicaDescs = Post "/api/v1/batch/replica-descs", Store, "master_batch_replica_descs",
            BatchKeysRequest => BatchReplicasResponse;
        /// Readers are done with values their lookups answered with `release`: once all
        /// reads of one are released, its lease ends and its memory copy may go.
        BatchReleaseReads = Post "/api/v1/batch/release-reads", Store, "master_batch_release_reads",
            BatchKeysRequest => ();
        /// Whether many objects exist.
        BatchExists = Post "/api/v1/batch/exists", Store, "master_batch_exists",
            BatchKeysRequest => BatchExistsResponse;
        /// Removes many objects.
        BatchRemove = Post "/api/v1/batch/remove", Store, "master_batch_remove",
            BatchRemoveRequest => BatchKeyResponse;
        /// Clears the replicas of a client's own objects, on one segment or all.
        BatchReplicaClear = Post "/api/v1/batch/replica-clear", Store, "master_batch_replica_clear",
            ReplicaClearRequest => ReplicaClearResponse;
        /// The disk tier's exchange with a segment's owner: finished tasks and disk
        /// records in, the next tasks out (held back up to `wait_ms` while there are none).
        TierExchangeRoute = Post "/api/v1/segments/{name}/tier", Store, "master_tier_exchange",
            TierExchange => TierTasks;
        /// The segment's owner stopped its disk tier: values only there are gone, no
        /// value goes there any more (Mooncake's `unmount_local_disk_segment`).
        DetachDisk = Post "/api/v1/segments/{name}/tier/detach", Store, "master_detach_disk",
            ClientRequest => RemovedResponse;
        /// What the store holds, as changes to follow: a snapshot first, then every
        /// stored, moved and removed key in order (long-polled with `wait_ms`).
        Events = Get "/api/v1/events", Store, "master_events",
            () with EventsQuery => StoreEvents;
        /// This master's role in an HA cluster (answered by every master itself).
        HaStatusRoute = Get "/api/v1/ha", Store, "master_ha_status", () => HaStatus;
        /// A transfer-metadata entry (Mooncake's HTTP metadata interface).
        GetMetadata = Get "/metadata", Store, "master_get_metadata",
            () with MetadataQuery => ();
        /// Stores a transfer-metadata entry.
        PutMetadata = Put "/metadata", Store, "master_put_metadata",
            () with MetadataQuery => String;
        /// Removes a transfer-metadata entry.
        DeleteMetadata = Delete "/metadata", Store, "master_delete_metadata",
            () with MetadataQuery => String;
    }
}

/// `moongate master`'s own routes beside the REST API.
pub mod master_ops {
    use crate::master::MasterHealth;

    routes! {
        /// The process is up.
        Health = Get "/health", Open, "health", () => MasterHealth;
        /// The liveness probe.
        Liveness = Get "/liveness", Open, "liveness", () => MasterHealth;
        /// Whether this master answers master calls (alone, or an HA leader or follower).
        Readiness = Get "/readiness", Open, "readiness", () => MasterHealth;
        /// Prometheus text exposition (`moongate_master_*`).
        Metrics = Get "/metrics", Open, "metrics", () => String;
    }
}

/// A storage node's routes (`moongate store`).
pub mod node {
    use crate::store::NodeHealth;

    routes! {
        /// The node's segment and master link.
        Health = Get "/health", Open, "node_health", () => NodeHealth;
        /// Prometheus text exposition (`moongate_store_*`).
        Metrics = Get "/metrics", Open, "node_metrics", () => String;
    }
}

/// The API documents, on every server that has one.
pub mod docs {
    routes! {
        /// The OpenAPI document.
        OpenapiJson = Get "/api-docs/openapi.json", Open, "openapi_json", () => ();
        /// The OpenAPI document at sglang-router's path.
        OpenapiJsonAlias = Get "/openapi.json", Open, "openapi_json_alias", () => ();
        /// Swagger UI: redirects to `/docs/`.
        SwaggerUiRoot = Get "/docs", Open, "swagger_ui_root", () => ();
        /// Swagger UI's page.
        SwaggerUiIndex = Get "/docs/", Open, "swagger_ui_index", () => ();
        /// Swagger UI's files.
        SwaggerUiFile = Get "/docs/{file}", Open, "swagger_ui_file", () => ();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_filled_with_one_encoded_segment_per_parameter() {
        let mut s = String::from("http://m");
        <master::PutStart as Endpoint>::ROUTE.fill(&mut s, &["a/b c?d%e_f-g.h~i"]);
        assert_eq!(
            s,
            "http://m/api/v1/objects/a%2Fb%20c%3Fd%25e_f-g.h~i/put-start"
        );
        let mut s = String::new();
        <master::UnmountSegment as Endpoint>::ROUTE.fill(&mut s, &["c1", "seg/1"]);
        assert_eq!(s, "/api/v1/clients/c1/segments/seg%2F1");
        let mut s = String::new();
        <master::Stats as Endpoint>::ROUTE.fill(&mut s, &[]);
        assert_eq!(s, "/api/v1/stats");
    }

    #[test]
    fn a_request_is_named_by_its_route_without_its_parameters() {
        let op = |m, p| operation_of(master::ALL, m, p);
        assert_eq!(
            op("POST", "/api/v1/objects/a%2Fb/put-start"),
            Some("master_put_start")
        );
        assert_eq!(op("get", "/api/v1/objects/k"), Some("master_get_object"));
        assert_eq!(op("GET", "/api/v1/objects"), Some("master_list_objects"));
        assert_eq!(op("GET", "/api/v1/events"), Some("master_events"));
        assert_eq!(op("PUT", "/api/v1/objects/k/put-start"), None);
        assert_eq!(op("POST", "/api/v1/objects//put-start"), None);
        assert_eq!(op("GET", "/api/v1/objects/k/extra/more"), None);
    }

    #[test]
    fn declarations_are_unique_and_name_their_types() {
        let all: Vec<Route> = [gateway::ALL, master::ALL, docs::ALL].concat();
        let mut seen = std::collections::HashSet::new();
        for r in &all {
            assert!(seen.insert((r.method, r.path)), "{r:?} declared twice");
            assert!(r.path.starts_with('/'), "{r:?}");
        }
        let put = <master::PutStart as Endpoint>::ROUTE;
        assert_eq!(put.body, Some("PutStartRequest"));
        assert_eq!(put.response, Some("PutStartResponse"));
        assert_eq!(
            <master::Remove as Endpoint>::ROUTE.query,
            Some("RemoveQuery")
        );
        assert_eq!(<gateway::Metrics as Endpoint>::ROUTE.response, None);
        assert_eq!(put.params(), 1);
    }
}
