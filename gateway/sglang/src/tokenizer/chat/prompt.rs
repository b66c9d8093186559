//! The fields of a chat request that shape its prompt, read from the body without copying
//! what the template does not see, and the messages prepared as SGLang prepares them before
//! they reach the template (content parts flattened or kept, tool calls and tools dumped).

use minijinja::value::{Value, ValueKind};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ContentFormat, TokenizerError, render_error};
use crate::memo::KeyedHash;

/// The fields of a chat request that shape its prompt.
#[derive(Debug, Clone, Default)]
pub struct ChatPrompt {
    /// `messages`, as sent (the fields a template may see).
    pub messages: Vec<Message>,
    /// `tools`, as sent.
    pub tools: Option<Vec<Value>>,
    /// `tool_choice`.
    pub tool_choice: Option<Value>,
    /// `chat_template_kwargs` (SGLang's extension): more template variables.
    pub chat_template_kwargs: Option<Value>,
    /// `reasoning_effort`, passed to the template.
    pub reasoning_effort: Option<Value>,
    /// `continue_final_message` (SGLang's extension): continue the last assistant message.
    pub continue_final_message: Option<bool>,
    /// `input_ids` (SGLang's extension): the prompt's ids, given; no template then.
    pub input_ids: Option<Vec<u32>>,
}

/// The fields of a chat request that shape its prompt, as the body's raw JSON: what a
/// [`ChatPrompt`] is read from, and what a prompt met before is recognized by
/// ([`RawChat::hash`]) before it is read or rendered.
#[derive(Debug, Deserialize)]
pub struct RawChat<'a> {
    #[serde(borrow)]
    messages: &'a RawValue,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tool_choice: Option<&'a RawValue>,
    #[serde(default, borrow)]
    chat_template_kwargs: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning_effort: Option<&'a RawValue>,
    #[serde(default, borrow)]
    continue_final_message: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input_ids: Option<&'a RawValue>,
}

impl<'a> RawChat<'a> {
    /// The chat fields of a `/v1/chat/completions` body (the rest is skipped unread).
    pub fn from_body(body: &'a [u8]) -> Result<Self, TokenizerError> {
        serde_json::from_slice(body).map_err(request_error)
    }

    /// The fields, read.
    pub fn prompt(&self) -> Result<ChatPrompt, TokenizerError> {
        Ok(ChatPrompt {
            messages: serde_json::from_str(self.messages.get()).map_err(request_error)?,
            tools: read(self.tools)?,
            tool_choice: read(self.tool_choice)?,
            chat_template_kwargs: read(self.chat_template_kwargs)?,
            reasoning_effort: read(self.reasoning_effort)?,
            continue_final_message: read(self.continue_final_message)?,
            input_ids: self.input_ids()?,
        })
    }

    /// The prompt's ids when the request brings them (`input_ids`, not empty): SGLang then
    /// skips the template.
    pub fn given_ids(&self) -> Result<Option<Vec<u32>>, TokenizerError> {
        Ok(self.input_ids()?.filter(|i| !i.is_empty()))
    }

    fn input_ids(&self) -> Result<Option<Vec<u32>>, TokenizerError> {
        read(self.input_ids)
    }

    /// These fields' key under `hash`: equal for bodies whose fields are the same bytes
    /// (other fields, and where these stand, do not count).
    pub fn hash(&self, hash: &KeyedHash) -> u128 {
        let get = |r: Option<&'a RawValue>| r.map(RawValue::get);
        hash.key(&(
            self.messages.get(),
            get(self.tools),
            get(self.tool_choice),
            get(self.chat_template_kwargs),
            get(self.reasoning_effort),
            get(self.continue_final_message),
            get(self.input_ids),
        ))
    }
}

/// A field of a [`RawChat`] read (absent or null: `None`).
fn read<T: serde::de::DeserializeOwned>(
    raw: Option<&RawValue>,
) -> Result<Option<T>, TokenizerError> {
    match raw {
        None => Ok(None),
        Some(r) => serde_json::from_str(r.get()).map_err(request_error),
    }
}

fn request_error(e: serde_json::Error) -> TokenizerError {
    TokenizerError::Request(e.to_string())
}

impl ChatPrompt {
    /// The chat fields of a `/v1/chat/completions` body.
    pub fn from_body(body: &[u8]) -> Result<Self, TokenizerError> {
        RawChat::from_body(body)?.prompt()
    }

    /// The prompt's ids when the request brings them (`input_ids`, not empty): SGLang then
    /// skips the template.
    pub fn given_ids(&self) -> Option<&[u32]> {
        self.input_ids.as_deref().filter(|i| !i.is_empty())
    }

    /// The tools the template sees (as `model_dump()` gives them): none with
    /// `tool_choice: "none"`, only the named one with a named choice.
    pub fn tools(&self) -> Option<Vec<Value>> {
        let tools = self.tools.as_ref().filter(|t| !t.is_empty())?;
        let name = |v: &Value| -> Option<String> {
            v.get_attr("function")
                .and_then(|f| f.get_attr("name"))
                .ok()
                .and_then(|n| n.as_str().map(str::to_owned))
        };
        // A named choice keeps only that tool (none when it names none).
        let named: Option<Option<String>> = match &self.tool_choice {
            Some(c) if c.as_str() == Some("none") => return None,
            Some(c) if c.kind() == ValueKind::Map => Some(name(c)),
            _ => None,
        };
        Some(
            tools
                .iter()
                .filter(|t| match &named {
                    None => true,
                    Some(n) => n.is_some() && name(t) == *n,
                })
                .map(dump_tool)
                .collect(),
        )
    }

    /// The messages the template sees and the text appended after it: a last assistant
    /// message with string content is the reply to continue (`continue_final_message`)
    /// or, without that, becomes a user message (SGLang's `_handle_last_assistant_message`).
    pub(super) fn conversation(
        &self,
        format: ContentFormat,
    ) -> Result<(Vec<Value>, Option<String>), TokenizerError> {
        let mut messages = self
            .messages
            .iter()
            .map(|m| prepare_message(m, format))
            .collect::<Result<Vec<_>, _>>()?;
        let last = messages.last().and_then(|m| {
            let role = m.get_attr("role").ok()?;
            let content = m.get_attr("content").ok()?;
            (role.as_str() == Some("assistant") && content.kind() == ValueKind::String)
                .then(|| content.as_str().unwrap_or_default().to_owned())
        });
        let Some(content) = last else {
            return Ok((messages, None));
        };
        messages.pop();
        if self.continue_final_message == Some(true) {
            return Ok((messages, Some(content)));
        }
        messages.push(Value::from_pairs([
            ("role", Value::from("user")),
            ("content", Value::from(content)),
        ]));
        Ok((messages, None))
    }
}

/// The fields of a message `model_dump()` gives, in its order (others are not kept); a
/// user message (SGLang's user model) has only the first two.
const MESSAGE_FIELDS: [&str; 7] = [
    "role",
    "content",
    "tool_call_id",
    "name",
    "reasoning_content",
    "tool_calls",
    "tools",
];

/// A message of a chat request: the fields SGLang's `model_dump()` keeps (`role`, `content`,
/// `tool_call_id`, `name`, `reasoning_content`, `tool_calls`, `tools`), read straight from
/// the body (any other field is skipped unread; of a field sent twice, the last counts, as
/// in Python).
#[derive(Debug, Clone, Default)]
pub struct Message {
    fields: [Option<Value>; MESSAGE_FIELDS.len()],
}

impl Message {
    /// Field `MESSAGE_FIELDS[i]`, none when absent or null.
    fn field(&self, i: usize) -> Option<Value> {
        self.fields[i]
            .clone()
            .filter(|v| !v.is_none() && !v.is_undefined())
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Message;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("each message to be an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Message, A::Error> {
                let mut m = Message::default();
                while let Some(FieldName(i)) = map.next_key()? {
                    match i {
                        Some(i) => m.fields[i] = Some(map.next_value()?),
                        None => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A message's key: its place in [`MESSAGE_FIELDS`], if there.
struct FieldName(Option<usize>);

impl<'de> Deserialize<'de> for FieldName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = FieldName;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, v: &str) -> Result<FieldName, E> {
                Ok(FieldName(MESSAGE_FIELDS.iter().position(|f| *f == v)))
            }
        }
        d.deserialize_str(Name)
    }
}

/// One message as SGLang hands it to the template (see the module doc).
fn prepare_message(m: &Message, format: ContentFormat) -> Result<Value, TokenizerError> {
    let role = m
        .field(0)
        .and_then(|r| r.as_str().map(str::to_ascii_lowercase))
        .ok_or_else(|| TokenizerError::Request("each message needs a role".to_owned()))?;
    let mut parts: Option<Value> = None;
    let kept = if role == "user" {
        2
    } else {
        MESSAGE_FIELDS.len()
    };
    let mut fields: Vec<(&str, Value)> = Vec::with_capacity(kept);
    for (i, &k) in MESSAGE_FIELDS[..kept].iter().enumerate() {
        if k == "role" {
            fields.push((k, Value::from(role.as_str())));
            continue;
        }
        let Some(v) = m.field(i) else {
            if k == "content" {
                fields.push((k, Value::from("")));
            }
            continue;
        };
        match k {
            "content" if v.kind() == ValueKind::Seq => {
                let all_text = v
                    .try_iter()
                    .map_err(render_error)?
                    .all(|p| part_type(&p).as_deref() == Some("text"));
                match (format, role == "tool" && all_text) {
                    (ContentFormat::String, _) | (_, true) => {
                        fields.push((k, flatten_content(&v, ContentFormat::String)?));
                    }
                    // The parts go last.
                    (ContentFormat::OpenAi, false) => parts = Some(flatten_content(&v, format)?),
                }
            }
            "tool_calls" if v.kind() == ValueKind::Seq => {
                let calls = v
                    .try_iter()
                    .map_err(render_error)?
                    .map(|c| dump_tool_call(&c))
                    .collect::<Result<Vec<_>, _>>()?;
                fields.push((k, Value::from(calls)));
            }
            "tools" if v.kind() == ValueKind::Seq => {
                let tools: Vec<Value> = v
                    .try_iter()
                    .map_err(render_error)?
                    .map(|t| dump_tool(&t))
                    .collect();
                fields.push((k, Value::from(tools)));
            }
            _ => fields.push((k, v)),
        }
    }
    if let Some(p) = parts {
        fields.push(("content", p));
    }
    Ok(Value::from_pairs(fields))
}

fn part_type(p: &Value) -> Option<String> {
    p.get_attr("type")
        .ok()
        .and_then(|t| t.as_str().map(str::to_owned))
}

fn flatten_content(parts: &Value, format: ContentFormat) -> Result<Value, TokenizerError> {
    let text = |p: &Value| p.get_attr("text").ok().filter(|t| !t.is_undefined());
    let items: Vec<Value> = parts.try_iter().map_err(render_error)?.collect();
    Ok(match format {
        ContentFormat::String => {
            let texts: Vec<String> = items
                .iter()
                .filter(|p| matches!(part_type(p).as_deref(), Some("text" | "input_text")))
                .filter_map(|p| text(p).map(|t| t.to_string()))
                .collect();
            Value::from(texts.join(" "))
        }
        ContentFormat::OpenAi => Value::from(
            items
                .iter()
                .filter_map(|p| {
                    let only = |t: &str| Some(Value::from_pairs([("type", Value::from(t))]));
                    match part_type(p).as_deref() {
                        Some("image_url" | "input_image") => only("image"),
                        Some("video_url") => only("video"),
                        Some("audio_url") => only("audio"),
                        Some("text" | "input_text") => Some(Value::from_pairs([
                            ("type", Value::from("text")),
                            ("text", text(p).unwrap_or_default()),
                        ])),
                        Some("tool_reference") => Some(p.clone()),
                        _ => None,
                    }
                })
                .collect::<Vec<_>>(),
        ),
    })
}

/// Field `k` of `v`, none when absent (as a pydantic model's unset field dumps).
pub(super) fn get(v: &Value, k: &str) -> Value {
    v.get_attr(k)
        .ok()
        .filter(|v| !v.is_undefined())
        .unwrap_or(Value::from(()))
}

/// Field `k` of `v`, or `default` when it is absent or null (a pydantic field's default).
fn get_or(v: &Value, k: &str, default: impl Into<Value>) -> Value {
    let found = get(v, k);
    if found.is_none() {
        default.into()
    } else {
        found
    }
}

/// A tool call as `model_dump()` gives it (`id`, `index`, `type`, `function` with `name`
/// and `arguments`), its arguments parsed when they are a JSON string (they must be an
/// object, as SGLang requires).
fn dump_tool_call(call: &Value) -> Result<Value, TokenizerError> {
    let function = get(call, "function");
    let arguments = get(&function, "arguments");
    let arguments = match arguments.as_str() {
        Some(s) => {
            let parsed: Value = serde_json::from_str(s).map_err(|e| {
                TokenizerError::Request(format!("tool call arguments are not JSON: {e}"))
            })?;
            if parsed.kind() != ValueKind::Map {
                return Err(TokenizerError::Request(
                    "tool call arguments must be a JSON object".to_owned(),
                ));
            }
            parsed
        }
        None => arguments,
    };
    Ok(Value::from_pairs([
        ("id", get(call, "id")),
        ("index", get(call, "index")),
        ("type", get_or(call, "type", "function")),
        (
            "function",
            Value::from_pairs([("name", get(&function, "name")), ("arguments", arguments)]),
        ),
    ]))
}

/// A tool as `model_dump()` gives it: `type`, `function` (`description`, `name`,
/// `parameters`, `strict`), `defer_loading`.
fn dump_tool(tool: &Value) -> Value {
    let function = get(tool, "function");
    let mut f = vec![
        ("description", get(&function, "description")),
        ("name", get(&function, "name")),
        ("parameters", get(&function, "parameters")),
        ("strict", get_or(&function, "strict", false)),
    ];
    let defer = get(&function, "defer_loading");
    if !defer.is_none() {
        f.push(("defer_loading", defer));
    }
    Value::from_pairs([
        ("type", get_or(tool, "type", "function")),
        ("function", Value::from_pairs(f)),
        ("defer_loading", get(tool, "defer_loading")),
    ])
}
