//! The gateway's one error type, classified once: each variant maps to an HTTP status,
//! an OpenAI error envelope, and who is at fault. The inner cause is logged here; the
//! client sees a clean message.

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use openapi::error::ErrorResponse;

use crate::admission::Refusal;
use crate::auth::Refusal as AuthRefusal;
use crate::select::NoWorker;
use crate::workers::manager::AddError;

/// Who caused a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client sent something wrong.
    Client,
    /// A worker failed or nobody can serve.
    Upstream,
    /// The gateway itself.
    Internal,
}

pub use crate::outcome::{PdFailure, PdSide};

/// Everything that can go wrong answering a request.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON (the parser's message).
    #[error("invalid JSON body: {0}")]
    InvalidJson(String),
    /// JSON, but not a request this route accepts.
    #[error("{0}")]
    InvalidRequest(String),
    /// Body larger than `--max-payload-size`.
    #[error("request body exceeds the {limit}-byte limit (--max-payload-size)")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A count in the body (`n`, the items of a batch, logprob alternatives) is over
    /// `--max-batch-size`.
    #[error("{field} is {count}; at most {limit} is accepted (--max-batch-size)")]
    TooMany {
        /// What was counted (a field name, or a product of them).
        field: &'static str,
        /// The count asked for (saturated at `u64::MAX`).
        count: u64,
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive within `--client-body-timeout-secs` of its first read.
    #[error("the request body did not arrive within {secs}s (--client-body-timeout-secs)")]
    BodyTimeout {
        /// The timeout.
        secs: u64,
    },
    /// Reading the client's body failed.
    #[error("could not read the request body: {0}")]
    ClientBody(String),
    /// No registered worker serves this model.
    #[error("no worker serves model '{0}'")]
    ModelNotFound(String),
    /// Workers exist but none is ready.
    #[error("no ready worker{}", .model.as_ref().map(|m| format!(" for model '{m}'")).unwrap_or_default())]
    NoReadyWorker {
        /// The model asked for.
        model: Option<String>,
    },
    /// Workers serve the model and are ready, but every one's circuit breaker is open.
    #[error("no available worker{}: every ready worker's circuit breaker is open", .model.as_ref().map(|m| format!(" for model '{m}'")).unwrap_or_default())]
    CircuitOpen {
        /// The model asked for.
        model: Option<String>,
    },
    /// A route PD mode does not serve (embeddings, classify, score: PD workers generate;
    /// the Responses API: its state lives on one worker, a pair cannot keep it).
    #[error("{0} is not served in PD mode: serve it from a gateway with regular workers")]
    NotInPdMode(&'static str),
    /// A response (or the one a request continues) whose worker is not known or has left.
    #[error("{}", match .previous {
        true => format!("previous response '{}' not found: the worker holding it is gone", .id),
        false => format!("response '{}' not found", .id),
    })]
    ResponseNotFound {
        /// The response id.
        id: String,
        /// Whether it was named as `previous_response_id`.
        previous: bool,
    },
    /// `/engine_metrics`: no worker, or none answered its `/metrics`.
    #[error("no worker answered /metrics")]
    NoWorkerMetrics,
    /// `/health_generate`: the worker (PD: one of the pair) did not generate.
    #[error("health generate failed: {0}")]
    HealthGenerateFailed(String),
    /// The worker the request names (`--target-worker-header`) cannot take it.
    #[error("the target worker '{0}' does not exist or cannot take the request now")]
    TargetUnavailable(String),
    /// PD: every ready worker of one side has its circuit breaker open.
    #[error("no available {side} worker: every ready one's circuit breaker is open")]
    PdCircuitOpen {
        /// The side.
        side: PdSide,
    },
    /// Admission control refused the request (429).
    #[error("{}", match .0 {
        Refusal::QueueFull { queue_size } => format!(
            "too many requests: every slot (--max-concurrent-requests) is taken and the queue (--queue-size {queue_size}) is full"),
        Refusal::QueueTimeout { timeout } => format!(
            "too many requests: no slot freed within {}s (--queue-timeout-secs)", timeout.as_secs()),
        Refusal::RateLimited { per_second, .. } => format!(
            "too many requests: over the rate limit of {per_second} per second (--rate-limit-tokens-per-second)"),
        Refusal::TenantBusy { max } => format!(
            "too many requests: this key's tenant already has {max} requests in flight (its concurrency in the client keys file)"),
        Refusal::TenantRateLimited { per_second, .. } => format!(
            "too many requests: over this key's tenant rate of {per_second} per second (its rate in the client keys file)"),
    })]
    Overloaded(Refusal),
    /// Connecting to the worker failed, or it reset the connection before answering.
    #[error("worker unreachable")]
    WorkerUnreachable {
        /// Worker URL.
        worker: String,
        /// Cause (logged, not shown).
        cause: String,
    },
    /// The worker did not answer within `--request-timeout-secs`.
    #[error("worker did not answer within {secs}s")]
    WorkerTimeout {
        /// Worker URL.
        worker: String,
        /// The timeout.
        secs: u64,
    },
    /// PD: no ready worker of one side.
    #[error("no ready {side} worker{}", .model.as_ref().map(|m| format!(" for model '{m}'")).unwrap_or_default())]
    NoReadyPdWorker {
        /// The side without a worker.
        side: PdSide,
        /// The model asked for.
        model: Option<String>,
    },
    /// PD: one side of the pair failed (the other was cancelled).
    #[error("{side} worker {}", match .failure {
        PdFailure::Unavailable => "unreachable".to_string(),
        PdFailure::BadGateway => "failed".to_string(),
        PdFailure::Timeout(s) => format!("did not answer within {s}s"),
    })]
    PdUpstream {
        /// Which side.
        side: PdSide,
        /// How.
        failure: PdFailure,
        /// Worker URL.
        worker: String,
        /// Cause (logged, not shown).
        cause: String,
    },
    /// No such worker id.
    #[error("no worker with id '{0}'")]
    WorkerNotFound(String),
    /// A worker registration that cannot be accepted.
    #[error("{0}")]
    InvalidWorker(String),
    /// URL registered already.
    #[error("{0}")]
    DuplicateWorker(String),
    /// No such route.
    #[error("no route for {0}")]
    RouteNotFound(String),
    /// The route's plane refused the request: its key is missing or wrong (401), or it is
    /// the admin plane of a server without an admin key and the caller is not on loopback
    /// (403).
    #[error("{}", .0.message())]
    Refused(AuthRefusal),
    /// Route exists, method does not.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A bug or resource failure in the gateway.
    #[error("internal error")]
    Internal(String),
}

impl GatewayError {
    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            InvalidJson(_)
            | InvalidRequest(_)
            | TooMany { .. }
            | ClientBody(_)
            | InvalidWorker(_) => StatusCode::BAD_REQUEST,
            BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refused(AuthRefusal::Unauthorized(_)) => StatusCode::UNAUTHORIZED,
            Refused(AuthRefusal::NotLoopback) => StatusCode::FORBIDDEN,
            ModelNotFound(_) | WorkerNotFound(_) | RouteNotFound(_) | ResponseNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            NotInPdMode(_) => StatusCode::NOT_IMPLEMENTED,
            DuplicateWorker(_) => StatusCode::CONFLICT,
            NoReadyWorker { .. }
            | NoReadyPdWorker { .. }
            | CircuitOpen { .. }
            | TargetUnavailable(_)
            | NoWorkerMetrics
            | HealthGenerateFailed(_)
            | PdCircuitOpen { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Overloaded(Refusal::QueueTimeout { .. }) => StatusCode::REQUEST_TIMEOUT,
            Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            PdUpstream {
                failure: PdFailure::Timeout(_),
                ..
            } => StatusCode::GATEWAY_TIMEOUT,
            PdUpstream { .. } => StatusCode::BAD_GATEWAY,
            WorkerUnreachable { .. } => StatusCode::BAD_GATEWAY,
            WorkerTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// `(type, code)` of the envelope.
    pub fn kind_and_code(&self) -> (&'static str, &'static str) {
        use GatewayError::*;
        match self {
            InvalidJson(_) => ("invalid_request_error", "invalid_json"),
            InvalidRequest(_) => ("invalid_request_error", "invalid_request"),
            TooMany { .. } => ("invalid_request_error", "too_many_items"),
            BodyTimeout { .. } => ("invalid_request_error", "request_timeout"),
            ClientBody(_) => ("invalid_request_error", "body_read_error"),
            PayloadTooLarge { .. } => ("invalid_request_error", "payload_too_large"),
            ModelNotFound(_) => ("invalid_request_error", "model_not_found"),
            NoReadyWorker { .. } => ("service_unavailable_error", "no_ready_worker"),
            CircuitOpen { .. } => ("service_unavailable_error", "circuit_open"),
            TargetUnavailable(_) => ("service_unavailable_error", "target_worker_unavailable"),
            NoWorkerMetrics => ("service_unavailable_error", "no_worker_metrics"),
            NotInPdMode(_) => ("invalid_request_error", "not_served_in_pd_mode"),
            ResponseNotFound { previous: true, .. } => {
                ("invalid_request_error", "previous_response_not_found")
            }
            ResponseNotFound {
                previous: false, ..
            } => ("invalid_request_error", "response_not_found"),
            HealthGenerateFailed(_) => ("service_unavailable_error", "health_generate_failed"),
            PdCircuitOpen { side } => (
                "service_unavailable_error",
                match side {
                    PdSide::Prefill => "prefill_circuit_open",
                    PdSide::Decode => "decode_circuit_open",
                },
            ),
            Overloaded(r) => ("rate_limit_error", r.label()),
            WorkerUnreachable { .. } => ("upstream_error", "worker_unreachable"),
            NoReadyPdWorker { side, .. } => (
                "service_unavailable_error",
                match side {
                    PdSide::Prefill => "no_ready_prefill_worker",
                    PdSide::Decode => "no_ready_decode_worker",
                },
            ),
            PdUpstream { side, failure, .. } => (
                "upstream_error",
                match (side, failure) {
                    (PdSide::Prefill, PdFailure::Unavailable) => "prefill_unavailable",
                    (PdSide::Prefill, PdFailure::BadGateway) => "prefill_bad_gateway",
                    (PdSide::Prefill, PdFailure::Timeout(_)) => "prefill_timeout",
                    (PdSide::Decode, PdFailure::Unavailable) => "decode_unavailable",
                    (PdSide::Decode, PdFailure::BadGateway) => "decode_bad_gateway",
                    (PdSide::Decode, PdFailure::Timeout(_)) => "decode_timeout",
                },
            ),
            WorkerTimeout { .. } => ("upstream_error", "worker_timeout"),
            WorkerNotFound(_) => ("not_found_error", "worker_not_found"),
            InvalidWorker(_) => ("invalid_request_error", "invalid_worker"),
            DuplicateWorker(_) => ("conflict_error", "worker_exists"),
            RouteNotFound(_) => ("not_found_error", "route_not_found"),
            Refused(AuthRefusal::Unauthorized(_)) => ("authentication_error", "invalid_api_key"),
            Refused(AuthRefusal::NotLoopback) => ("permission_error", "admin_loopback_only"),
            MethodNotAllowed => ("invalid_request_error", "method_not_allowed"),
            Internal(_) => ("server_error", "internal_error"),
        }
    }

    /// Who is at fault.
    pub fn side(&self) -> Side {
        match self.status().as_u16() {
            500 => Side::Internal,
            502..=504 => Side::Upstream,
            _ => Side::Client,
        }
    }

    /// The envelope.
    pub fn envelope(&self) -> ErrorResponse {
        let (kind, code) = self.kind_and_code();
        ErrorResponse::new(self.to_string(), kind, code)
    }
}

/// The envelope's `(type, code)` for an error answer with `status` that did not say (a
/// worker's own error, see [`crate::proxy::envelope`]): the status's class, and the status
/// named in snake case (`bad_request`, `internal_server_error`, ...).
pub fn status_kind(status: StatusCode) -> (&'static str, String) {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let code = match status.canonical_reason() {
        Some(r) => r
            .chars()
            .filter_map(|c| match c {
                ' ' | '-' => Some('_'),
                c if c.is_ascii_alphanumeric() => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        None => format!("http_{}", status.as_u16()),
    };
    (kind, code)
}

impl From<NoWorker> for GatewayError {
    fn from(e: NoWorker) -> Self {
        match e {
            NoWorker::UnknownModel(m) => Self::ModelNotFound(m),
            NoWorker::NoneReady => Self::NoReadyWorker { model: None },
            NoWorker::CircuitOpen => Self::CircuitOpen { model: None },
            NoWorker::TargetUnavailable(t) => Self::TargetUnavailable(t),
        }
    }
}

impl From<AddError> for GatewayError {
    fn from(e: AddError) -> Self {
        match e {
            AddError::Duplicate(d) => Self::DuplicateWorker(d.to_string()),
            other => Self::InvalidWorker(other.to_string()),
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            Self::WorkerUnreachable { worker, cause } => {
                tracing::warn!(%worker, %cause, "worker unreachable")
            }
            Self::WorkerTimeout { worker, secs } => tracing::warn!(%worker, secs, "worker timeout"),
            Self::PdUpstream {
                side,
                worker,
                cause,
                ..
            } => tracing::warn!(%side, %worker, %cause, "PD request failed"),
            Self::Internal(cause) => tracing::error!(%cause, "internal error"),
            Self::ClientBody(cause) => tracing::debug!(%cause, "client body read failed"),
            other => tracing::debug!(status = status.as_u16(), error = %other, "request refused"),
        }
        let body = serde_json::to_vec(&self.envelope()).unwrap_or_default();
        let mut resp = Response::new(axum::body::Body::from(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Self::Overloaded(r) = &self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_secs()));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_its_status_and_envelope() {
        let cases = [
            (GatewayError::InvalidJson("x".into()), 400, "invalid_json"),
            (
                GatewayError::TooMany {
                    field: "n",
                    count: 5,
                    limit: 4,
                },
                400,
                "too_many_items",
            ),
            (
                GatewayError::BodyTimeout { secs: 3 },
                408,
                "request_timeout",
            ),
            (
                GatewayError::PayloadTooLarge { limit: 3 },
                413,
                "payload_too_large",
            ),
            (
                GatewayError::ModelNotFound("m".into()),
                404,
                "model_not_found",
            ),
            (
                GatewayError::NoReadyWorker { model: None },
                503,
                "no_ready_worker",
            ),
            (
                GatewayError::WorkerUnreachable {
                    worker: "w".into(),
                    cause: "secret detail".into(),
                },
                502,
                "worker_unreachable",
            ),
            (
                GatewayError::WorkerTimeout {
                    worker: "w".into(),
                    secs: 1,
                },
                504,
                "worker_timeout",
            ),
            (
                GatewayError::DuplicateWorker("d".into()),
                409,
                "worker_exists",
            ),
            (GatewayError::MethodNotAllowed, 405, "method_not_allowed"),
            (
                GatewayError::PdUpstream {
                    side: PdSide::Prefill,
                    failure: PdFailure::Unavailable,
                    worker: "p".into(),
                    cause: "secret refused".into(),
                },
                502,
                "prefill_unavailable",
            ),
            (
                GatewayError::PdUpstream {
                    side: PdSide::Decode,
                    failure: PdFailure::BadGateway,
                    worker: "d".into(),
                    cause: "secret 500".into(),
                },
                502,
                "decode_bad_gateway",
            ),
            (
                GatewayError::PdUpstream {
                    side: PdSide::Decode,
                    failure: PdFailure::Timeout(3),
                    worker: "d".into(),
                    cause: "secret".into(),
                },
                504,
                "decode_timeout",
            ),
            (
                GatewayError::NoReadyPdWorker {
                    side: PdSide::Prefill,
                    model: None,
                },
                503,
                "no_ready_prefill_worker",
            ),
            (
                GatewayError::Refused(AuthRefusal::Unauthorized(crate::auth::Plane::Client)),
                401,
                "invalid_api_key",
            ),
            (
                GatewayError::Refused(AuthRefusal::NotLoopback),
                403,
                "admin_loopback_only",
            ),
            (
                GatewayError::CircuitOpen { model: None },
                503,
                "circuit_open",
            ),
            (
                GatewayError::PdCircuitOpen {
                    side: PdSide::Decode,
                },
                503,
                "decode_circuit_open",
            ),
            (
                GatewayError::Overloaded(Refusal::QueueFull { queue_size: 3 }),
                429,
                "queue_full",
            ),
            (
                GatewayError::Overloaded(Refusal::QueueTimeout {
                    timeout: std::time::Duration::from_secs(2),
                }),
                408,
                "queue_timeout",
            ),
            (
                GatewayError::Overloaded(Refusal::TenantBusy { max: 2 }),
                429,
                "tenant_concurrency_limited",
            ),
            (
                GatewayError::Overloaded(Refusal::TenantRateLimited {
                    per_second: 3,
                    retry_after: std::time::Duration::from_millis(300),
                }),
                429,
                "tenant_rate_limited",
            ),
            (
                GatewayError::Overloaded(Refusal::RateLimited {
                    per_second: 5,
                    retry_after: std::time::Duration::from_millis(1500),
                }),
                429,
                "rate_limited",
            ),
        ];
        for (e, status, code) in cases {
            assert_eq!(e.status().as_u16(), status);
            let env = e.envelope();
            assert_eq!(env.error.code.as_deref(), Some(code));
            assert!(
                !env.error.message.contains("secret"),
                "causes are not shown"
            );
        }
        assert_eq!(
            GatewayError::WorkerTimeout {
                worker: "w".into(),
                secs: 1
            }
            .side(),
            Side::Upstream
        );
        assert_eq!(GatewayError::InvalidJson("x".into()).side(), Side::Client);
        let resp = GatewayError::Overloaded(Refusal::RateLimited {
            per_second: 5,
            retry_after: std::time::Duration::from_millis(1500),
        })
        .into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }
}
