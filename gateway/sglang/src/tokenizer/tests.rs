use std::path::PathBuf;

use super::chat::{ContentFormat, strftime};
use super::*;

/// The test tokenizer and its golden ids (`tests/fixtures/tokenizer`, made by `make.py`
/// with Hugging Face's own `tokenizers` and `transformers`).
fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::load(&fixture(), None).expect("the fixture loads")
}

/// One golden case: a text prompt or a chat request (kept as written: key order matters).
#[derive(serde::Deserialize)]
struct Case {
    text: Option<String>,
    request: Option<Box<serde_json::value::RawValue>>,
    rendered: Option<String>,
    ids: Vec<u32>,
}

fn golden() -> Vec<Case> {
    let text = std::fs::read_to_string(fixture().join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn text_prompts_give_the_ids_transformers_gives() {
    let tok = tokenizer();
    let mut seen = 0;
    for case in golden() {
        let Some(text) = &case.text else { continue };
        assert_eq!(tok.text_ids(text).unwrap(), case.ids, "{text:?}");
        seen += 1;
    }
    assert_eq!(seen, 5);
    // The post-processor's BOS only with special tokens.
    let bare = tok.encode("Once upon a time", false).unwrap();
    assert_eq!(&tok.text_ids("Once upon a time").unwrap()[1..], &bare[..]);
}

#[test]
fn chat_prompts_render_and_encode_as_sglang_and_transformers_do() {
    let tok = tokenizer();
    assert!(tok.has_chat_template());
    let mut seen = 0;
    for case in golden() {
        let Some(body) = &case.request else { continue };
        let prompt = ChatPrompt::from_body(body.get().as_bytes()).unwrap();
        let rendered = tok.render_chat(&prompt).unwrap();
        assert_eq!(Some(&rendered), case.rendered.as_ref());
        assert_eq!(tok.chat_ids(&prompt).unwrap(), case.ids, "{rendered:?}");
        seen += 1;
    }
    assert_eq!(seen, 7);
}

#[test]
fn loads_from_the_tokenizer_file_too_and_takes_an_explicit_template() {
    let dir = tempfile::tempdir().unwrap();
    for f in [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE] {
        std::fs::copy(fixture().join(f), dir.path().join(f)).unwrap();
    }
    let by_file = Tokenizer::load(&dir.path().join(TOKENIZER_FILE), None).unwrap();
    assert!(
        by_file.has_chat_template(),
        "the config next to the file is read"
    );
    let prompt =
        ChatPrompt::from_body(br#"{"messages":[{"role":"user","content":"Hi"}]}"#).unwrap();
    let plain = dir.path().join("plain.jinja");
    std::fs::write(
        &plain,
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
    )
    .unwrap();
    let explicit = Tokenizer::load(dir.path(), Some(&plain)).unwrap();
    assert_eq!(explicit.render_chat(&prompt).unwrap(), "[user] Hi\n");
    // chat_template.jinja beside the config wins over the config's.
    std::fs::write(
        dir.path().join(CHAT_TEMPLATE_FILE),
        "{{ bos_token }}|{{ eos_token }}|{{ messages | length }}",
    )
    .unwrap();
    let separate = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(separate.render_chat(&prompt).unwrap(), "<s>|</s>|1");
}

#[test]
fn named_templates_pick_tool_use_for_requests_with_tools() {
    let config = serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools:{{ tools | length }}"},
            {"name": "default", "template": "plain"},
        ]
    });
    let t = ChatTemplate::from_config(Some(&config), None)
        .unwrap()
        .unwrap();
    let plain = ChatPrompt::from_body(br#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert_eq!(t.render(&plain).unwrap(), "plain");
    let tools = ChatPrompt::from_body(
        br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}]}"#,
    )
    .unwrap();
    assert_eq!(t.render(&tools).unwrap(), "tools:2");
    let named = ChatPrompt {
        tool_choice: Some(
            serde_json::from_str(r#"{"type":"function","function":{"name":"b"}}"#).unwrap(),
        ),
        ..tools.clone()
    };
    assert_eq!(named.tools().unwrap().len(), 1);
    assert!(ChatTemplate::from_config(None, None).unwrap().is_none());
    let bad = serde_json::json!({"chat_template": [{"name": "x"}]});
    assert!(ChatTemplate::from_config(Some(&bad), None).is_err());
}

#[test]
fn content_parts_follow_the_templates_format() {
    for (template, format) in [
        (
            "{% for m in messages %}{{ m.content }}{% endfor %}",
            ContentFormat::String,
        ),
        (
            "{%- for part in message['content'] %}{{ part.text }}{% endfor %}",
            ContentFormat::OpenAi,
        ),
        (
            "{% for c in message.content %}{% endfor %}",
            ContentFormat::OpenAi,
        ),
        ("<|vision_start|>", ContentFormat::OpenAi),
        // `message.content_parts` is not a loop over the content.
        (
            "{% for p in message.content_parts %}{% endfor %}",
            ContentFormat::String,
        ),
    ] {
        assert_eq!(ContentFormat::detect(template), format, "{template}");
    }
    let src = "{% for message in messages %}{% for p in message.content %}<{{ p.type }}:{{ p.text }}>{% endfor %}|{{ message | tojson }}{% endfor %}";
    let t = ChatTemplate::from_config(None, Some(src.to_owned()))
        .unwrap()
        .unwrap();
    assert_eq!(t.format(), ContentFormat::OpenAi);
    let p = ChatPrompt::from_body(
        br#"{"messages":[{"content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:,"}},{"type":"weird"}],"role":"user","name":null}]}"#,
    )
    .unwrap();
    assert_eq!(
        t.render(&p).unwrap(),
        r#"<text:look><image:>|{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}"#
    );
}

#[test]
fn bad_requests_and_templates_are_typed_errors() {
    let tok = tokenizer();
    let render = |body: &[u8]| tok.render_chat(&ChatPrompt::from_body(body)?);
    let err = render(br#"{"messages":[{"role":"robot","content":"x"}]}"#).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Render(m) if m.contains("Unknown role: robot")),
        "{err}"
    );
    assert!(matches!(
        render(br#"{"messages":"no"}"#),
        Err(TokenizerError::Request(_))
    ));
    assert!(matches!(
        render(br#"{"messages":[1]}"#),
        Err(TokenizerError::Request(_))
    ));
    assert!(matches!(
        render(br#"{"messages":[{"content":"no role"}]}"#),
        Err(TokenizerError::Request(_))
    ));
    let bad_args = br#"{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]},{"role":"user","content":"x"}]}"#;
    assert!(matches!(render(bad_args), Err(TokenizerError::Request(_))));
    assert!(matches!(
        render(br#"{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}"#),
        Err(TokenizerError::Request(_))
    ));
    assert!(matches!(
        ChatTemplate::from_config(None, Some("{% for %}".to_owned())),
        Err(TokenizerError::Template(_))
    ));
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Tokenizer::load(dir.path(), None),
        Err(TokenizerError::Read { .. })
    ));
    std::fs::write(dir.path().join(TOKENIZER_FILE), "{}").unwrap();
    assert!(matches!(
        Tokenizer::load(dir.path(), None),
        Err(TokenizerError::Load { .. })
    ));
    std::fs::copy(
        fixture().join(TOKENIZER_FILE),
        dir.path().join(TOKENIZER_FILE),
    )
    .unwrap();
    std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), "{").unwrap();
    assert!(matches!(
        Tokenizer::load(dir.path(), None),
        Err(TokenizerError::Config { .. })
    ));
    std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), "{}").unwrap();
    let bare = Tokenizer::load(dir.path(), None).unwrap();
    assert!(!bare.has_chat_template());
    let p = ChatPrompt::from_body(br#"{"messages":[]}"#).unwrap();
    assert!(matches!(
        bare.chat_ids(&p),
        Err(TokenizerError::NoChatTemplate)
    ));
    // A request that brings its ids needs no template.
    let p = ChatPrompt::from_body(br#"{"messages":[],"input_ids":[4,5]}"#).unwrap();
    assert_eq!(bare.chat_ids(&p).unwrap(), vec![4, 5]);
}

#[test]
fn a_render_is_bounded_whatever_the_messages() {
    // 300 messages through three nested loops: 27 M iterations, far past the budget.
    let src = "{% for a in messages %}{% for b in messages %}{% for c in messages %}x{% endfor %}{% endfor %}{% endfor %}";
    let err = render_many(src, 300, "x").unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Render(m) if m.contains("fuel")),
        "{err}"
    );
}

/// `src` rendered over `n` user messages of `content`.
fn render_many(src: &str, n: usize, content: &str) -> Result<String, TokenizerError> {
    let t = ChatTemplate::from_config(None, Some(src.to_owned()))?.unwrap();
    let messages: Vec<serde_json::Value> = (0..n)
        .map(|_| serde_json::json!({"role": "user", "content": content}))
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({ "messages": messages })).unwrap();
    t.render(&ChatPrompt::from_body(&body)?)
}

#[test]
fn reasoning_effort_reaches_the_template_and_sets_the_thinking_default() {
    let src = "{{ reasoning_effort }} {{ enable_thinking }} {{ thinking }}";
    let t = ChatTemplate::from_config(None, Some(src.to_owned()))
        .unwrap()
        .unwrap();
    let p = |body: &str| ChatPrompt::from_body(body.as_bytes()).unwrap();
    assert_eq!(
        t.render(&p(r#"{"messages":[],"reasoning_effort":"none"}"#))
            .unwrap(),
        "none False False"
    );
    assert_eq!(
        t.render(&p(
            r#"{"messages":[],"reasoning_effort":"high","chat_template_kwargs":{"thinking":false}}"#
        ))
        .unwrap(),
        "high True False"
    );
}

#[test]
fn strftime_now_writes_the_directives_templates_use() {
    // 2024-02-29 13:05:09 UTC; the expected text is Python's time.strftime of it.
    assert_eq!(
        strftime("%d %b %Y %A %a %B %m %y %H:%M:%S %j %% %Q", 1_709_211_909),
        "29 Feb 2024 Thursday Thu February 02 24 13:05:09 060 % %Q"
    );
    assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
    let t = ChatTemplate::from_config(None, Some("{{ strftime_now('%Y') | length }}".to_owned()))
        .unwrap()
        .unwrap();
    assert_eq!(t.render(&ChatPrompt::default()).unwrap(), "4");
}

#[test]
fn sglang_details_tool_retry_named_choice_and_generation_tags() {
    // A template that wants bare functions gets them on the second try.
    let src = "{% if tools and tools[0].type is defined %}{{ raise_exception('bare functions') }}{% endif %}{{ tools[0].name }}";
    let t = ChatTemplate::from_config(None, Some(src.to_owned()))
        .unwrap()
        .unwrap();
    let body = br#"{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}"#;
    assert_eq!(
        t.render(&ChatPrompt::from_body(body).unwrap()).unwrap(),
        "f"
    );
    // A named choice without a name keeps no tool.
    let p = ChatPrompt::from_body(
        br#"{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function"}}"#,
    )
    .unwrap();
    assert_eq!(p.tools().unwrap().len(), 0);
    // transformers' generation tags render nothing.
    let src =
        "{% for m in messages %}{%- generation -%}{{ m.content }}{%- endgeneration -%}{% endfor %}";
    let t = ChatTemplate::from_config(None, Some(src.to_owned()))
        .unwrap()
        .unwrap();
    let p = ChatPrompt::from_body(br#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
    assert_eq!(t.render(&p).unwrap(), "hi");
}

#[test]
fn tojson_output_is_bounded() {
    let src = "{{ messages | tojson(indent=4) }}";
    let err = render_many(src, 8, &"x".repeat(pyjson::MAX_BYTES / 4)).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Render(m) if m.contains("too long")),
        "{err}"
    );
}

#[test]
fn messages_have_the_fields_of_sglangs_models() {
    // A user message keeps role and content only; another role's tools are dumped.
    let t = ChatTemplate::from_config(None, Some("{{ messages | tojson }}".to_owned()))
        .unwrap()
        .unwrap();
    let p = ChatPrompt::from_body(
        br#"{"messages":[{"role":"system","content":"s","name":"x","tools":[{"type":"function","function":{"name":"f"}}]},{"name":"bob","content":"hi","role":"user","extra":1},{"role":"user","content":"again"}]}"#,
    )
    .unwrap();
    assert_eq!(
        t.render(&p).unwrap(),
        r#"[{"role": "system", "content": "s", "name": "x", "tools": [{"type": "function", "function": {"description": null, "name": "f", "parameters": null, "strict": false}, "defer_loading": null}]}, {"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]"#
    );
}

#[test]
fn special_tokens_come_from_the_map_file_when_the_settings_lack_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture().join(TOKENIZER_FILE),
        dir.path().join(TOKENIZER_FILE),
    )
    .unwrap();
    std::fs::write(
        dir.path().join(TOKENIZER_CONFIG_FILE),
        r#"{"eos_token": "</s>", "chat_template": "{{ bos_token }}|{{ eos_token }}"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join(SPECIAL_TOKENS_MAP_FILE),
        r#"{"bos_token": {"content": "<s>"}, "eos_token": "<other>"}"#,
    )
    .unwrap();
    let tok = Tokenizer::load(dir.path(), None).unwrap();
    assert_eq!(tok.render_chat(&ChatPrompt::default()).unwrap(), "<s>|</s>");
    std::fs::write(dir.path().join(SPECIAL_TOKENS_MAP_FILE), "[1]").unwrap();
    assert!(matches!(
        Tokenizer::load(dir.path(), None),
        Err(TokenizerError::Config { .. })
    ));
}

/// A deterministic mix of words, spaces, newlines, accents and the fixture's special
/// tokens, each text `n`.
fn mixed_text(n: u64) -> String {
    const PARTS: [&str; 14] = [
        "Hello",
        " world",
        "\n",
        "\n\n",
        "  ",
        "<|im_start|>",
        "<|im_end|>",
        "<s>",
        "</s>",
        "user",
        ", again!",
        " é",
        "ünïcode",
        "<|im_", // a special token's start alone
    ];
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut s = String::new();
    for _ in 0..(3 + n % 17) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(PARTS[(x % PARTS.len() as u64) as usize]);
    }
    s
}

#[test]
fn pieces_give_the_ids_of_the_whole_text_from_the_cache_and_without() {
    let whole = tokenizer();
    let cached = tokenizer().with_cache(1 << 20);
    assert!(cached.caches_pieces());
    assert!(
        cached.pieces.as_ref().unwrap().wraps_text(),
        "the fixture's BOS is found"
    );
    for round in 0..2 {
        for n in 0..300 {
            let text = mixed_text(n);
            for special in [false, true] {
                let want = whole.encode(&text, special).unwrap();
                assert_eq!(
                    cached.encode(&text, special).unwrap(),
                    want,
                    "{text:?} {round}"
                );
                assert_eq!(
                    cached.encode_cached(&text, special).unwrap(),
                    want,
                    "{text:?}"
                );
            }
        }
    }
    // The golden ids, through the cache.
    for case in golden() {
        if let Some(text) = &case.text {
            assert_eq!(cached.text_ids(text).unwrap(), case.ids, "{text:?}");
        }
        if let Some(body) = &case.request {
            let prompt = ChatPrompt::from_body(body.get().as_bytes()).unwrap();
            assert_eq!(cached.chat_ids(&prompt).unwrap(), case.ids);
            let rendered = cached.render_chat(&prompt).unwrap();
            assert_eq!(cached.encode_cached(&rendered, false).unwrap(), case.ids);
        }
    }
}

#[test]
fn a_conversations_next_turn_encodes_only_its_new_pieces() {
    let tok = tokenizer().with_cache(1 << 20);
    let body = |turns: usize| {
        let mut messages = vec![serde_json::json!({"role": "system", "content": "Be brief."})];
        for i in 0..turns {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            messages.push(serde_json::json!({"role": role, "content": format!("turn {i} text")}));
        }
        serde_json::to_vec(&serde_json::json!({ "messages": messages })).unwrap()
    };
    let render = |turns| {
        tok.render_chat(&ChatPrompt::from_body(&body(turns)).unwrap())
            .unwrap()
    };
    let one = render(1);
    assert!(matches!(
        tok.encode_cached(&one, false),
        Err(TokenizerError::NotCached)
    ));
    let ids = tok.encode(&one, false).unwrap();
    let pieces = tok.pieces.as_ref().unwrap();
    let after_one = pieces.entries();
    assert_eq!(tok.encode_cached(&one, false).unwrap(), ids);
    // Two more turns: their texts are the new pieces; everything before comes from the cache.
    let three = render(3);
    assert!(matches!(
        tok.encode_cached(&three, false),
        Err(TokenizerError::NotCached)
    ));
    let more = tok.encode(&three, false).unwrap();
    assert_eq!(more, tokenizer().encode(&three, false).unwrap());
    let prompt_tail = tok.encode("<|im_start|>assistant\n", false).unwrap();
    let earlier = &ids[..ids.len() - prompt_tail.len()];
    assert_eq!(&more[..earlier.len()], earlier, "the earlier turn's ids");
    assert_eq!(
        pieces.entries(),
        after_one + 2,
        "the two new turns' pieces kept"
    );
}

#[test]
fn tokenizers_whose_pieces_are_not_independent_encode_whole() {
    let dir = tempfile::tempdir().unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join(TOKENIZER_FILE)).unwrap())
            .unwrap();
    let load = |json: &serde_json::Value| {
        std::fs::write(dir.path().join(TOKENIZER_FILE), json.to_string()).unwrap();
        Tokenizer::load(dir.path(), None)
            .unwrap()
            .with_cache(1 << 20)
    };
    assert!(load(&json).caches_pieces());
    // A special token that eats the whitespace before it.
    let mut lstrip = json.clone();
    lstrip["added_tokens"][3]["lstrip"] = true.into();
    let t = load(&lstrip);
    assert!(!t.caches_pieces());
    assert!(matches!(
        t.encode_cached("a", false),
        Err(TokenizerError::NotCached)
    ));
    // Metaspace putting its `▁` before the text's first piece only.
    let mut first = json.clone();
    first["pre_tokenizer"] = serde_json::json!({
        "type": "Sequence",
        "pretokenizers": [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}]
    });
    assert!(!load(&first).caches_pieces());
    // Special tokens encoded as text.
    let mut t = Tokenizer::load(&fixture(), None).unwrap();
    t.inner.set_encode_special_tokens(true);
    assert!(!t.with_cache(1 << 20).caches_pieces());
    // No cache asked for.
    assert!(!tokenizer().with_cache(0).caches_pieces());
}

#[test]
fn a_chat_prompt_sent_again_is_neither_rendered_nor_encoded_again() {
    let tok = tokenizer().with_cache(1 << 20);
    assert!(tok.remembers_chats());
    let body =
        br#"{"model":"m","messages":[{"role":"user","content":"Hello there"}],"max_tokens":4}"#;
    let want = tokenizer()
        .chat_ids(&ChatPrompt::from_body(body).unwrap())
        .unwrap();
    let Ok(ChatText::Render {
        text,
        memo: Some(key),
    }) = tok.chat_text(body)
    else {
        panic!("a prompt never met is rendered");
    };
    assert!(
        matches!(tok.chat_text(body), Ok(ChatText::Render { .. })),
        "nothing is kept before its ids are"
    );
    tok.remember_chat_ids(key, &tok.encode(&text, false).unwrap());
    let Ok(ChatText::Ids(ids)) = tok.chat_text(body) else {
        panic!("kept");
    };
    assert_eq!(&ids[..], &want[..]);
    // Fields the template does not see, and the order of the fields, do not count.
    let other = br#"{"max_tokens":99,"stream":true,"messages":[{"role":"user","content":"Hello there"}],"model":"x"}"#;
    assert!(matches!(tok.chat_text(other), Ok(ChatText::Ids(_))));
    // Every field it sees does.
    let tools = r#""tools":[{"type":"function","function":{"name":"f","parameters":{}}}]"#;
    for changed in [
        r#""messages":[{"role":"user","content":"Hello there!"}]"#.to_owned(),
        format!(r#""messages":[{{"role":"user","content":"Hello there"}}],{tools}"#),
        format!(
            r#""messages":[{{"role":"user","content":"Hello there"}}],{tools},"tool_choice":"none""#
        ),
        r#""messages":[{"role":"user","content":"Hello there"}],"reasoning_effort":"none""#
            .to_owned(),
        r#""messages":[{"role":"user","content":"Hello there"}],"chat_template_kwargs":{"enable_thinking":false}"#
            .to_owned(),
        r#""messages":[{"role":"user","content":"Hello there"}],"continue_final_message":false"#
            .to_owned(),
    ] {
        let body = format!("{{{changed}}}");
        assert!(
            matches!(tok.chat_text(body.as_bytes()), Ok(ChatText::Render { .. })),
            "{body}"
        );
    }
    // `chat_body_ids` keeps what it encodes.
    let second = br#"{"messages":[{"role":"user","content":"Second"}]}"#;
    let ids = tok.chat_body_ids(second).unwrap();
    assert!(matches!(tok.chat_text(second), Ok(ChatText::Ids(_))));
    assert_eq!(tok.chat_body_ids(second).unwrap(), ids);
    // Given ids are the prompt; a bad body is a typed error.
    let given = tok.chat_text(br#"{"messages":[],"input_ids":[4,5]}"#);
    assert!(matches!(given, Ok(ChatText::Ids(i)) if i[..] == [4, 5]));
    for bad in [
        &b"{"[..],
        br#"{"messages":5}"#,
        br#"{"messages":[],"input_ids":"x"}"#,
    ] {
        assert!(matches!(
            tok.chat_text(bad),
            Err(TokenizerError::Request(_))
        ));
    }
    // No memo without a cache, or for a template whose render reads the clock.
    assert!(!tokenizer().with_cache(0).remembers_chats());
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock.jinja");
    std::fs::write(
        &clock,
        "{{ strftime_now('%d %b %Y') }} {{ messages | length }}",
    )
    .unwrap();
    let dated = Tokenizer::load(&fixture(), Some(&clock))
        .unwrap()
        .with_cache(1 << 20);
    assert!(!dated.remembers_chats() && dated.caches_pieces());
    assert!(matches!(
        dated.chat_text(body),
        Ok(ChatText::Render { memo: None, .. })
    ));
}
