//! Wire types of every Moongate HTTP API.
//!
//! Every request and response body that crosses a Moongate HTTP boundary is defined here,
//! once, with `serde` for the bytes and `utoipa::ToSchema` for the OpenAPI document. The
//! gateway and the KV master both depend on this crate; it depends on nothing of theirs.
//!
//! # Layout
//! - [`error`]: the OpenAI error envelope `{"error":{"message","type","code"}}` every HTTP
//!   error is answered with.
//! - [`workers`]: the gateway's worker admin API (`/workers`).
//! - [`console`]: the cluster at a glance (`/cluster`), which the console page draws.
//! - [`bounded`]: lists bounded while they are parsed (the master's request bodies).
//! - [`master`]: the KV-cache master's REST API (`/api/v1/...`) and `/metadata` store.
//! - [`store`]: a storage node's own endpoints (`moongate store`: `/health`).
//! - [`shapes`]: shapes shared by OpenAI and SGLang bodies: a value or a list
//!   ([`shapes::OneOrMany`]), stop sequences, the four prompt forms, `input_ids`.
//! - [`openai`]: the OpenAI-compatible API as SGLang serves it: chat completions
//!   ([`openai::chat`]), completions ([`openai::completions`]), models, usage.
//! - [`routes`]: every route the servers serve, declared once (method, path, plane, body
//!   and answer types): read by the servers' routers and documents and by the store client.
//! - [`sglang`]: SGLang's native `/generate` (batches, sampling parameters, logprobs,
//!   finish reasons) and, in [`sglang::server`], its info, load and error bodies.
//!
//! Request types keep unknown fields in `extra` and write them back unchanged, so the
//! gateway forwards SGLang's many extension fields without knowing them.

pub mod bounded;
pub mod console;
pub mod error;
pub mod master;
pub mod openai;
pub mod routes;
pub mod sglang;
pub mod shapes;
pub mod store;
pub mod workers;

#[cfg(test)]
mod tests {
    use utoipa::ToSchema;
    use utoipa::openapi::{ComponentsBuilder, RefOr, schema::Schema};

    use crate::openai::ModelList;
    use crate::openai::chat::{ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse};
    use crate::openai::completions::{CompletionRequest, CompletionResponse};
    use crate::sglang::server::{ErrorResponse, GenerateError, Loads, ModelInfo, ServerInfo};
    use crate::sglang::{GenerateRequest, GenerateResponse};

    /// The OpenAI and SGLang schemas render (generic and hand-deserialized types included)
    /// and name the fields clients send.
    #[test]
    fn generation_schemas_render() {
        let mut all = Vec::new();
        collect::<ChatCompletionRequest>(&mut all);
        collect::<ChatCompletionResponse>(&mut all);
        collect::<ChatCompletionChunk>(&mut all);
        collect::<CompletionRequest>(&mut all);
        collect::<CompletionResponse>(&mut all);
        collect::<ModelList>(&mut all);
        collect::<GenerateRequest>(&mut all);
        collect::<GenerateResponse>(&mut all);
        collect::<ServerInfo>(&mut all);
        collect::<ModelInfo>(&mut all);
        collect::<Loads>(&mut all);
        collect::<ErrorResponse>(&mut all);
        collect::<GenerateError>(&mut all);
        let components = ComponentsBuilder::new().schemas_from_iter(all).build();
        let json = serde_json::to_value(&components).unwrap();
        let chat = &json["schemas"]["ChatCompletionRequest"];
        assert!(chat.to_string().contains("max_completion_tokens"), "{chat}");
        let generate = json["schemas"]["GenerateRequest"].to_string();
        assert!(
            generate.contains("sampling_params")
                && generate.contains("#/components/schemas/Routing"),
            "{generate}"
        );
        let routing = json["schemas"]["Routing"].to_string();
        assert!(routing.contains("bootstrap_room"), "{routing}");
        let refs = regex_refs(&json.to_string());
        for r in refs {
            assert!(json["schemas"].get(&r).is_some(), "dangling $ref to {r}");
        }
        assert!(
            !json["schemas"]["CompletionRequest"]
                .to_string()
                .contains("\"extra\"")
        );
    }

    type Schemas = Vec<(String, RefOr<Schema>)>;

    /// `T`'s schema and every schema it refers to.
    fn collect<T: ToSchema>(all: &mut Schemas) {
        all.push((T::name().into_owned(), T::schema()));
        T::schemas(all);
    }

    /// Names of every `#/components/schemas/...` reference in `doc`.
    fn regex_refs(doc: &str) -> Vec<String> {
        doc.split("#/components/schemas/")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap_or_default().to_owned())
            .collect()
    }
}
