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

mod prompt;

use prompt::get;
pub use prompt::{ChatPrompt, Message, RawChat};

use super::{TokenizerError, pyjson};

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

pub(super) fn render_error(e: Error) -> TokenizerError {
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
