//! Chat templates: the model's Jinja template rendered as `transformers` renders it, over
//! the messages as SGLang prepares them.
//!
//! - **Environment** (`transformers`' `_compile_jinja_template`): `trim_blocks`,
//!   `lstrip_blocks`, loop controls, Python's `str`/`dict`/`list` methods (minijinja's
//!   `pycompat`), the `tojson` filter of [`super::pyjson`], `raise_exception(msg)` and
//!   `strftime_now(fmt)` (UTC: `transformers` uses the worker's local time, which in the
//!   containers SGLang runs in is UTC), `{% generation %}` tags dropped; each render's
//!   instructions and output bounded by [`RENDER_FUEL`] and `tojson`'s by
//!   [`pyjson::MAX_BYTES`]; what the request's messages become before it, by the body cap
//!   of the caller (the gateway's `proxy::prompt::MAX_TOKENIZE_BODY_BYTES`).
//! - A render that fails with tools is tried once more with each tool's bare `function`,
//!   as SGLang does.
//! - **Variables**: `messages`, `tools` (none when absent), `documents` (none),
//!   `add_generation_prompt` (true), the tokenizer's special tokens (`bos_token`,
//!   `eos_token`, ...), `reasoning_effort` when given (then `thinking` and `enable_thinking`
//!   default to `effort != "none"`), then the request's `chat_template_kwargs` (which win).
//! - **Messages** (SGLang's chat route, 2026): each message's `model_dump()` fields (`role`
//!   lower-cased, `content`, then, except for a user message, `tool_call_id`, `name`,
//!   `reasoning_content`, `tool_calls`, `tools` dumped as below), null ones dropped and a
//!   null content made `""`; a list of content parts
//!   becomes, for a template that does not loop over `message.content` ("string" format, and
//!   for a tool message of text parts only), its text parts joined with spaces, else ("openai"
//!   format, moved last) the parts with images, audio and video reduced to `{"type": ...}`;
//!   tool calls dumped with their arguments parsed (a JSON object). A last assistant message
//!   with string content is continued (`continue_final_message`: its text follows the
//!   render) or else becomes a user message.
//! - **Tools**: each tool's `model_dump()` (`type`, `function` with `description`, `name`,
//!   `parameters`, `strict`, then `defer_loading`); none with `tool_choice: "none"`, only the
//!   named one with a named `tool_choice`.
//! - **Which template**: `--chat-template`, else `chat_template.jinja`, else
//!   `tokenizer_config.json`'s `chat_template` (a string, or named templates: `tool_use`
//!   when the request has tools and the model has one, else `default`).

use std::sync::LazyLock;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{TokenizerError, pyjson};
use crate::memo::KeyedHash;

/// The special tokens `transformers` passes to a template, when the tokenizer sets them.
pub const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// What one render may spend (minijinja's fuel: about one per instruction and one per
/// 64 bytes made): a request's messages cannot make a template loop or allocate without
/// bound. A real conversation spends thousands to tens of thousands.
pub const RENDER_FUEL: u64 = 1_000_000;

/// How a template expects `message.content`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string (content parts are flattened).
    String,
    /// OpenAI's list of parts (the template loops over them).
    OpenAi,
}

impl ContentFormat {
    /// SGLang's detection: a template that mentions images, audio, video or vision, or
    /// loops over `message.content` (also `msg`/`m`), wants parts; any other, a string.
    pub fn detect(template: &str) -> Self {
        static LOOP: LazyLock<regex::Regex> = LazyLock::new(|| {
            regex::Regex::new(
                r#"\{%-?\s*for\s+\w+\s+in\s+(?:message|msg|m)\s*(?:\.\s*content\b|\[\s*['"]content['"]\s*\])"#,
            )
            .expect("a valid pattern")
        });
        let multimodal = ["image", "audio", "video", "vision"]
            .iter()
            .any(|k| template.contains(k));
        if multimodal || LOOP.is_match(template) {
            ContentFormat::OpenAi
        } else {
            ContentFormat::String
        }
    }
}

/// A compiled chat template (or the model's named templates) with its variables.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Template names, `default` first.
    names: Vec<String>,
    format: ContentFormat,
    special: Vec<(Value, Value)>,
    /// Whether a template calls `strftime_now` (its render changes with the date).
    reads_clock: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("names", &self.names)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of a tokenizer's settings (`tokenizer_config.json`), or `explicit`
    /// in its place; `None` when there is neither.
    pub fn from_config(
        config: Option<&serde_json::Value>,
        explicit: Option<String>,
    ) -> Result<Option<Self>, TokenizerError> {
        let mut sources: Vec<(String, String)> =
            match (explicit, config.and_then(|c| c.get("chat_template"))) {
                (Some(t), _) => vec![("default".to_owned(), t)],
                (None, Some(serde_json::Value::String(t))) => {
                    vec![("default".to_owned(), t.clone())]
                }
                (None, Some(serde_json::Value::Array(named))) => named
                    .iter()
                    .map(|n| {
                        let name = n.get("name").and_then(|v| v.as_str());
                        let template = n.get("template").and_then(|v| v.as_str());
                        match (name, template) {
                            (Some(name), Some(t)) => Ok((name.to_owned(), t.to_owned())),
                            _ => Err(TokenizerError::Template(
                                "a named chat template needs a name and a template".to_owned(),
                            )),
                        }
                    })
                    .collect::<Result<_, _>>()?,
                (None, None | Some(serde_json::Value::Null)) => return Ok(None),
                (None, Some(_)) => {
                    return Err(TokenizerError::Template(
                        "chat_template must be a string or a list of named templates".to_owned(),
                    ));
                }
            };
        if sources.is_empty() {
            return Ok(None);
        }
        if !sources.iter().any(|(n, _)| n == "default") {
            // transformers picks `default`; without one, the only template.
            if sources.len() > 1 {
                return Err(TokenizerError::Template(
                    "named chat templates without a `default` one".to_owned(),
                ));
            }
            sources[0].0 = "default".to_owned();
        }
        sources.sort_by_key(|(n, _)| n != "default");
        let format = ContentFormat::detect(&sources[0].1);
        let reads_clock = sources.iter().any(|(_, t)| t.contains("strftime_now"));
        let env = environment(&sources)?;
        let special = config.map(special_tokens).unwrap_or_default();
        Ok(Some(ChatTemplate {
            env,
            names: sources.into_iter().map(|(n, _)| n).collect(),
            format,
            special,
            reads_clock,
        }))
    }

    /// Whether its render of a prompt may change with the time (it calls `strftime_now`),
    /// so that what it rendered must not be kept.
    pub fn reads_clock(&self) -> bool {
        self.reads_clock
    }

    /// The content format its default template expects.
    pub fn format(&self) -> ContentFormat {
        self.format
    }

    /// `prompt` rendered (with the generation prompt).
    pub fn render(&self, prompt: &ChatPrompt) -> Result<String, TokenizerError> {
        let tools = prompt.tools();
        let name = match tools {
            Some(_) if self.names.iter().any(|n| n == "tool_use") => "tool_use",
            _ => "default",
        };
        let (messages, prefix) = prompt.conversation(self.format)?;
        // Keys as values: these short ones are held inline, not allocated.
        let mut ctx: Vec<(Value, Value)> = Vec::with_capacity(8 + self.special.len());
        ctx.extend([
            (Value::from("messages"), Value::from(messages)),
            (
                Value::from("tools"),
                tools.clone().map_or(Value::from(()), Value::from),
            ),
            (Value::from("documents"), Value::from(())),
            (Value::from("add_generation_prompt"), Value::from(true)),
        ]);
        ctx.extend(self.special.iter().cloned());
        let mut kwargs: Vec<(Value, Value)> = Vec::new();
        if let Some(kw) = prompt
            .chat_template_kwargs
            .as_ref()
            .filter(|k| !k.is_none())
        {
            if kw.kind() != ValueKind::Map {
                return Err(TokenizerError::Request(
                    "chat_template_kwargs must be an object".to_owned(),
                ));
            }
            for k in kw.try_iter().map_err(render_error)? {
                let v = kw.get_item(&k).map_err(render_error)?;
                kwargs.push((k, v));
            }
        }
        if let Some(r) = prompt.reasoning_effort.as_ref().filter(|r| !r.is_none()) {
            // The request's validator defaults the thinking switches from the effort.
            let thinking = Value::from(r.as_str() != Some("none"));
            for k in ["thinking", "enable_thinking"] {
                if !kwargs.iter().any(|(n, _)| n.as_str() == Some(k)) {
                    kwargs.push((Value::from(k), thinking.clone()));
                }
            }
            ctx.push((Value::from("reasoning_effort"), r.clone()));
        }
        ctx.extend(kwargs);
        let template = self.env.get_template(name).map_err(render_error)?;
        // Kept for the second try only when there is one.
        let again = tools.is_some().then(|| ctx.clone());
        // Later entries win, as Python's keyword arguments.
        let mut text = match template.render(Value::from_pairs(ctx)) {
            Ok(t) => t,
            // SGLang renders again with each tool's bare `function` (what some templates,
            // Mistral's among them, expect).
            Err(e) => match (&tools, again) {
                (Some(tools), Some(mut ctx)) => {
                    let bare: Vec<Value> = tools.iter().map(|t| get(t, "function")).collect();
                    ctx[1].1 = Value::from(bare);
                    template
                        .render(Value::from_pairs(ctx))
                        .map_err(|_| render_error(e))?
                }
                _ => return Err(render_error(e)),
            },
        };
        text.push_str(prefix.as_deref().unwrap_or_default());
        Ok(text)
    }
}

fn render_error(e: Error) -> TokenizerError {
    TokenizerError::Render(match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.to_string(),
    })
}

fn environment(sources: &[(String, String)]) -> Result<Environment<'static>, TokenizerError> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| TokenizerError::Template(e.to_string()))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(RENDER_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjson::tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    // transformers' `{% generation %}` marks the assistant's tokens for training masks and
    // renders nothing of its own.
    static GENERATION: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(r"\{%-?\s*(?:end)?generation\s*-?%\}").expect("a valid pattern")
    });
    for (name, src) in sources {
        let src = GENERATION.replace_all(src, "").into_owned();
        env.add_template_owned(name.clone(), src)
            .map_err(|e| TokenizerError::Template(format!("template {name}: {e:#}")))?;
    }
    Ok(env)
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC time with the directives chat templates use
/// (`%d %m %Y %y %b %B %a %A %H %M %S %j %%`; others are written as given).
fn strftime_now(fmt: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&fmt, secs)
}

/// `fmt` for the UTC time `secs` after the Unix epoch.
pub fn strftime(fmt: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (the inverse of the above).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A special token's text: a string or an `AddedToken` object's `content`.
fn special_tokens(config: &serde_json::Value) -> Vec<(Value, Value)> {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    };
    let mut out: Vec<(Value, Value)> = SPECIAL_TOKENS
        .iter()
        .filter_map(|k| Some((Value::from(*k), Value::from(text(config.get(*k)?)?))))
        .collect();
    if let Some(serde_json::Value::Array(extra)) = config.get("additional_special_tokens") {
        let list: Vec<Value> = extra.iter().filter_map(text).map(Value::from).collect();
        out.push((Value::from("additional_special_tokens"), Value::from(list)));
    }
    out
}

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
    fn conversation(
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
fn get(v: &Value, k: &str) -> Value {
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
