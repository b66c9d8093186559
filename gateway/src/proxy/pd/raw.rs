//! JSON read without building values: objects as their members in order, arrays as their
//! elements, each a slice of the bytes it was read from ([`RawValue`]). The PD rewrites use
//! it to change a few nested values of a body and copy everything else byte for byte, in
//! memory proportional to the body (a value tree costs many times its text).

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::proxy::inspect::KeyName;

/// An object's members, in order (a key that appears twice is there twice).
pub type Members<'a> = Vec<(Cow<'a, str>, &'a RawValue)>;

/// The members of `json` when it is an object.
pub fn object(json: &str) -> Option<Members<'_>> {
    serde_json::from_str::<Object<'_>>(json).ok().map(|o| o.0)
}

/// The elements of `json` when it is an array.
pub fn array(json: &str) -> Option<Vec<&RawValue>> {
    if !json.trim_start().starts_with('[') {
        return None;
    }
    serde_json::from_str(json).ok()
}

/// The value of `key` (the last one, as JSON parsers read duplicates).
pub fn get<'a>(members: &Members<'a>, key: &str) -> Option<&'a RawValue> {
    members
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
}

/// `json` as an unsigned integer.
pub fn as_u64(json: &RawValue) -> Option<u64> {
    serde_json::from_str(json.get()).ok()
}

/// Writes `elems` as an array into `out`, element `i` swapped for `new[i]` when that is
/// `Some`.
pub fn write_array(out: &mut Vec<u8>, elems: &[&RawValue], new: &[Option<Vec<u8>>]) {
    out.push(b'[');
    for (i, old) in elems.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let text = new.get(i).and_then(Option::as_deref);
        out.extend_from_slice(text.unwrap_or(old.get().as_bytes()));
    }
    out.push(b']');
}

/// Writes `members` as an object into `out`, the value of every key in `replace` swapped
/// for its new text (keys `replace` has and `members` lacks are added at the end).
pub fn write_object(out: &mut Vec<u8>, members: &Members<'_>, replace: &[(&str, Vec<u8>)]) {
    out.push(b'{');
    let mut first = true;
    let mut member = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
        if !first {
            out.push(b',');
        }
        first = false;
        // A string always serializes.
        let _ = serde_json::to_writer(&mut *out, key);
        out.push(b':');
        out.extend_from_slice(value);
    };
    for (k, v) in members {
        let value = replace
            .iter()
            .find(|(r, _)| *r == k.as_ref())
            .map_or(v.get().as_bytes(), |(_, new)| new.as_slice());
        member(out, k, value);
    }
    for (k, new) in replace {
        if !members.iter().any(|(m, _)| m == k) {
            member(out, k, new);
        }
    }
    out.push(b'}');
}

/// An object read as its members.
struct Object<'a>(Members<'a>);

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(KeyName(k)) = map.next_key()? {
                    members.push((k, map.next_value()?));
                }
                Ok(Object(members))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_in_order_and_values_byte_for_byte() {
        let json = r#" {"a" : [1, 2 ],"b\u0031":{"x":null},"a":3} "#;
        let m = object(json).unwrap();
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(keys, ["a", "b1", "a"]);
        assert_eq!(m[0].1.get(), "[1, 2 ]");
        assert_eq!(get(&m, "a").unwrap().get(), "3");
        let mut out = Vec::new();
        write_object(
            &mut out,
            &m,
            &[("b1", b"0".to_vec()), ("c", b"[]".to_vec())],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":[1, 2 ],"b1":0,"a":3,"c":[]}"#
        );
        assert!(object("[1]").is_none() && object("{").is_none());
        assert_eq!(array("[1, {\"a\":2}]").unwrap()[1].get(), "{\"a\":2}");
        assert!(array("{}").is_none());
        assert_eq!(
            as_u64(get(&object(r#"{"i":7}"#).unwrap(), "i").unwrap()),
            Some(7)
        );
    }
}
