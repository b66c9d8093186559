//! `transformers`' `tojson` filter for chat templates: Python's `json.dumps(x,
//! ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, byte for byte.
//!
//! minijinja's own `tojson` writes compact JSON and escapes `<`, `>`, `&` and `'` for
//! HTML; a template that renders tools with it would not give the text (and the tokens)
//! the worker renders. Python's spacing: `", "` and `": "` without an indent, `","` and
//! `": "` with one (each item on its own line); floats as Python's `repr`.

use std::fmt::Write;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Longest text one `tojson` call writes (minijinja charges a filter's output only once it
/// exists): a request's tools nested deep and indented cannot blow up memory.
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

/// How to write: Python's `json.dumps` keyword arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Style {
    /// `indent`: the string each level adds (`None`: all on one line).
    pub indent: Option<String>,
    /// `separators`: between items, between a key and its value.
    pub separators: (String, String),
    /// `ensure_ascii`: escape every non-ASCII character.
    pub ensure_ascii: bool,
    /// `sort_keys`.
    pub sort_keys: bool,
}

impl Default for Style {
    fn default() -> Self {
        Style {
            indent: None,
            separators: (", ".to_owned(), ": ".to_owned()),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

/// The `tojson` filter.
pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut style = Style::default();
    if let Some(i) = kwargs
        .get::<Option<Value>>("indent")?
        .filter(|i| !i.is_none())
    {
        style.indent = Some(match (i.as_str(), i.as_usize()) {
            (Some(s), _) => s.to_owned(),
            (None, Some(n)) => " ".repeat(n.min(64)),
            _ => return Err(invalid("tojson: indent must be an integer or a string")),
        });
        style.separators.0 = ",".to_owned();
    }
    if let Some(seps) = kwargs
        .get::<Option<Value>>("separators")?
        .filter(|s| !s.is_none())
    {
        let parts: Vec<String> = seps
            .try_iter()?
            .map(|s| s.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("tojson: separators must be two strings"))?;
        let [item, key]: [String; 2] = parts
            .try_into()
            .map_err(|_| invalid("tojson: separators must be two strings"))?;
        style.separators = (item, key);
    }
    if let Some(a) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = a;
    }
    if let Some(s) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = s;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

/// `value` as Python's `json.dumps` writes it with `style`.
pub fn dumps(value: &Value, style: &Style) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_owned())
}

fn write_value(out: &mut String, v: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    if depth > 128 {
        return Err(invalid("tojson: value nested too deeply"));
    }
    if out.len() > MAX_BYTES {
        return Err(invalid("tojson: the value's JSON is too long"));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => write_float(out, f64::try_from(v.clone()).unwrap_or(f64::NAN)),
        ValueKind::String => write_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_cached_key(|k| k.to_string());
            }
            let items = keys
                .into_iter()
                .map(|k| {
                    let val = v.get_item(&k)?;
                    Ok((k, val))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            write_container(out, ('{', '}'), &items, style, depth, |out, (k, val)| {
                match k.as_str() {
                    Some(s) => write_str(out, s, style.ensure_ascii),
                    None => write_str(out, &k.to_string(), style.ensure_ascii),
                }
                out.push_str(&style.separators.1);
                write_value(out, val, style, depth + 1)
            })?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, style, depth, |out, item| {
                write_value(out, item, style, depth + 1)
            })?;
        }
        _ => {
            return Err(invalid(&format!(
                "tojson: a value of kind {} is not JSON serializable",
                v.kind()
            )));
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: &[T],
    style: &Style,
    depth: usize,
    mut each: impl FnMut(&mut String, &T) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.separators.0);
        }
        if let Some(ind) = &style.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth + 1));
        }
        each(out, item)?;
    }
    if let Some(ind) = &style.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// A JSON string as Python writes it: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`; with `ensure_ascii`, DEL and every non-ASCII character as
/// `\uXXXX` (a surrogate pair above U+FFFF).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && c == '\u{7f}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr`: the shortest digits that read back the same, `1.0` for an
/// integral value, exponent form (`1e-05`, `1e+16`) outside `[1e-4, 1e16)`.
fn write_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f == 0.0 || (1e-4..1e16).contains(&f.abs()) {
        let s = format!("{f}");
        out.push_str(&s);
        if !s.contains('.') {
            out.push_str(".0");
        }
    } else {
        // Rust writes `1e-5` / `1.5e16`; Python `1e-05` / `1.5e+16`.
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(src, ctx).unwrap()
    }

    fn json(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        // Expected strings are Python 3.11's json.dumps(x, ensure_ascii=False) outputs.
        let v = json(
            r#"{"name": "get", "n": [1, 2.5, -0.0, 1e-05, 1e20, true, null], "e": {}, "l": [],
                "s": "a\"b\\c\n\t\u0001</tag>&'é"}"#,
        );
        let ctx = Value::from_pairs([("v", v)]);
        assert_eq!(
            render("{{ v | tojson }}", ctx.clone()),
            r#"{"name": "get", "n": [1, 2.5, -0.0, 1e-05, 1e+20, true, null], "e": {}, "l": [], "s": "a\"b\\c\n\t\u0001</tag>&'é"}"#
        );
        assert_eq!(
            render("{{ v.n | tojson(indent=2) }}", ctx.clone()),
            "[\n  1,\n  2.5,\n  -0.0,\n  1e-05,\n  1e+20,\n  true,\n  null\n]"
        );
        assert_eq!(
            render(
                "{{ v.s | tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': [2]} | tojson(sort_keys=true, separators=[',', ':']) }}",
                ctx
            ),
            r#""a\"b\\c\n\t\u0001</tag>&'\u00e9" {"a":[2],"b":1}"#
        );
        assert_eq!(
            dumps(
                &json(r#""🦀""#),
                &Style {
                    ensure_ascii: true,
                    ..Style::default()
                }
            )
            .unwrap(),
            r#""\ud83e\udd80""#
        );
    }

    #[test]
    fn keeps_the_order_of_keys() {
        let ctx = Value::from_pairs([("v", json(r#"{"z": 1, "a": 2, "m": {"y": 1, "b": 2}}"#))]);
        assert_eq!(
            render("{{ v | tojson }}", ctx),
            r#"{"z": 1, "a": 2, "m": {"y": 1, "b": 2}}"#
        );
    }

    #[test]
    fn refuses_what_it_cannot_write() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        assert!(env.render_str("{{ 1 | tojson(indent=[1]) }}", ()).is_err());
        assert!(env.render_str("{{ 1 | tojson(colour=1) }}", ()).is_err());
        assert!(
            env.render_str("{{ 1 | tojson(separators=[',']) }}", ())
                .is_err()
        );
    }
}
