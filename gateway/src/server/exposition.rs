//! Merging Prometheus text expositions from several sources into one (`/engine_metrics`):
//! every sample gains a label naming its source, and each metric family is written once
//! (its first `# HELP` and `# TYPE`, then the samples of every source), as the text format
//! requires of a family's samples. Lines that are neither comments nor samples are dropped.

use std::collections::HashMap;

/// One family: its header lines and samples, in the order they came.
#[derive(Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

/// `texts` (source, exposition) merged, each sample labelled `label="<source>"`.
pub fn merge(texts: &[(String, String)], label: &str) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: HashMap<String, Family> = HashMap::new();
    for (source, text) in texts {
        let tag = format!("{label}=\"{}\"", escape(source));
        // The family a sample belongs to: the last one declared whose name it extends
        // (`x_bucket`, `x_sum`, `x_count` of histogram `x`), else its own name.
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = line.trim_end();
            if let Some(rest) = line
                .strip_prefix("# HELP ")
                .or(line.strip_prefix("# TYPE "))
            {
                let Some(name) = rest.split_whitespace().next() else {
                    continue;
                };
                let fam = family(&mut families, &mut order, name);
                if line.starts_with("# HELP") {
                    fam.help.get_or_insert_with(|| line.to_owned());
                } else {
                    fam.kind.get_or_insert_with(|| line.to_owned());
                }
                current = Some(name.to_owned());
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, labelled)) = with_label(line, &tag) else {
                continue;
            };
            let owner = match &current {
                Some(c) if name.starts_with(c.as_str()) => c.clone(),
                _ => name.to_owned(),
            };
            family(&mut families, &mut order, &owner)
                .samples
                .push(labelled);
        }
    }
    let mut out = String::new();
    for name in &order {
        let f = &families[name];
        for line in f.help.iter().chain(&f.kind).chain(&f.samples) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn family<'a>(
    families: &'a mut HashMap<String, Family>,
    order: &mut Vec<String>,
    name: &str,
) -> &'a mut Family {
    if !families.contains_key(name) {
        order.push(name.to_owned());
    }
    families.entry(name.to_owned()).or_default()
}

/// A sample line with `tag` added to its labels, and the sample's name; `None` for a line
/// that is not a sample (`name[{labels}] value [timestamp]`, the value a float, the
/// timestamp an integer).
fn with_label<'l>(line: &'l str, tag: &str) -> Option<(&'l str, String)> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let rest = &line[end..];
    let (labels, tail) = match rest.strip_prefix('{') {
        Some(inner) => {
            let close = closing_brace(inner)?;
            (Some(inner[..close].trim()), &inner[close + 1..])
        }
        None => (None, rest),
    };
    let mut fields = tail.split_whitespace();
    let value_ok = fields.next().is_some_and(|v| v.parse::<f64>().is_ok());
    let ts_ok = fields.next().is_none_or(|t| t.parse::<i64>().is_ok());
    if !value_ok || !ts_ok || fields.next().is_some() || !tail.starts_with([' ', '\t']) {
        return None;
    }
    let labelled = match labels {
        Some(l) if !l.is_empty() => format!("{name}{{{tag},{l}}}{tail}"),
        _ => format!("{name}{{{tag}}}{tail}"),
    };
    Some((name, labelled))
}

/// Where the label set that `inner` (what follows `{`) opens ends: its `}` outside quotes.
fn closing_brace(inner: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in inner.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// A label value as the text format writes it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_once_with_every_sources_samples_labelled() {
        let a = "# HELP sglang:num_running_reqs Running.\n# TYPE sglang:num_running_reqs gauge\n\
                 sglang:num_running_reqs{model_name=\"m\"} 3\n\
                 # TYPE lat histogram\nlat_bucket{le=\"1\"} 1\nlat_sum 0.5\nlat_count 1\n";
        let b = "# HELP sglang:num_running_reqs Running.\n# TYPE sglang:num_running_reqs gauge\n\
                 sglang:num_running_reqs{model_name=\"m\"} 5\nnot a sample\nup 1 1700000000\n";
        let out = merge(
            &[
                ("http://a:1".into(), a.into()),
                ("http://b:1".into(), b.into()),
            ],
            "worker_addr",
        );
        assert_eq!(
            out,
            "# HELP sglang:num_running_reqs Running.\n# TYPE sglang:num_running_reqs gauge\n\
             sglang:num_running_reqs{worker_addr=\"http://a:1\",model_name=\"m\"} 3\n\
             sglang:num_running_reqs{worker_addr=\"http://b:1\",model_name=\"m\"} 5\n\
             # TYPE lat histogram\n\
             lat_bucket{worker_addr=\"http://a:1\",le=\"1\"} 1\n\
             lat_sum{worker_addr=\"http://a:1\"} 0.5\n\
             lat_count{worker_addr=\"http://a:1\"} 1\n\
             up{worker_addr=\"http://b:1\"} 1 1700000000\n"
        );
    }

    #[test]
    fn odd_lines_and_label_values_are_handled() {
        assert_eq!(
            with_label("x{} 1", "t=\"v\""),
            Some(("x", "x{t=\"v\"} 1".into()))
        );
        assert_eq!(with_label("9x 1", "t"), None);
        assert_eq!(with_label("{a=\"b\"} 1", "t"), None);
        assert_eq!(with_label("x", "t"), None);
        assert_eq!(
            with_label("x{a=\"}\"} 2", "t"),
            Some(("x", "x{t,a=\"}\"} 2".into()))
        );
        assert_eq!(
            with_label("x{a=\"b\"} NaN", "t").unwrap().1,
            "x{t,a=\"b\"} NaN"
        );
        assert_eq!(with_label("x 1 2 3", "t"), None);
        assert_eq!(with_label("x{a=\"b\"", "t"), None);
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
