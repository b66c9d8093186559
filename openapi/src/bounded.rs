//! Lists whose length is bounded while they are parsed, so no request body can make a
//! server allocate more items than it allows, whatever the body says.
//!
//! A list field marked `#[serde(deserialize_with = "crate::bounded::vec")]` refuses its
//! element number [`limit`] + 1 as it reads it (with an error naming the limit), and never
//! reserves room from a length the input announces beyond that (JSON announces none; other
//! formats may). The limit is the one a server sets around its parse with [`with_limit`]
//! (the KV master: its `max_batch_items`); outside such a scope it is [`UNSCOPED_LIMIT`].
//!
//! The limit lives in a thread-local for the duration of one synchronous parse: serde gives
//! a `Deserialize` implementation no other way to learn a runtime setting short of
//! hand-written seeds for every request type.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};

/// Most items a bounded list holds when parsed outside [`with_limit`].
pub const UNSCOPED_LIMIT: usize = 1 << 16;

/// Most items reserved up front from a length the input announces (the rest, up to the
/// limit, grow as they arrive).
const MAX_PREALLOC: usize = 4096;

thread_local! {
    static LIMIT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `parse` with every bounded list limited to `limit` items. `parse` must parse
/// synchronously (the limit is this thread's until `parse` returns); scopes nest.
pub fn with_limit<R>(limit: usize, parse: impl FnOnce() -> R) -> R {
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.with(|l| l.set(self.0));
        }
    }
    let _restore = Restore(LIMIT.with(|l| l.replace(Some(limit))));
    parse()
}

/// The limit in force on this thread.
pub fn limit() -> usize {
    LIMIT.with(Cell::get).unwrap_or(UNSCOPED_LIMIT)
}

/// Deserializes a list of at most [`limit`] items (`deserialize_with` target).
pub fn vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    d.deserialize_seq(Bounded(limit(), PhantomData))
}

struct Bounded<T>(usize, PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of at most {} items", self.0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let announced = seq.size_hint().unwrap_or(0);
        if announced > self.0 {
            return Err(A::Error::custom(too_long(self.0)));
        }
        let mut out = Vec::with_capacity(announced.min(MAX_PREALLOC));
        while let Some(item) = seq.next_element()? {
            if out.len() == self.0 {
                return Err(A::Error::custom(too_long(self.0)));
            }
            out.push(item);
        }
        Ok(out)
    }
}

fn too_long(limit: usize) -> String {
    format!("a list of more than {limit} items (the limit)")
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Keys {
        #[serde(deserialize_with = "vec")]
        keys: Vec<String>,
    }

    fn parse(limit: usize, json: &str) -> Result<Vec<String>, String> {
        with_limit(limit, || serde_json::from_str::<Keys>(json))
            .map(|k| k.keys)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn lists_up_to_the_limit_pass_longer_ones_are_refused() {
        assert_eq!(parse(2, r#"{"keys":["a","b"]}"#).unwrap(), ["a", "b"]);
        assert_eq!(parse(2, r#"{"keys":[]}"#).unwrap(), Vec::<String>::new());
        let e = parse(2, r#"{"keys":["a","b","c"]}"#).unwrap_err();
        assert!(e.contains("more than 2 items"), "{e}");
        // The scope ends with the parse, also when it fails.
        assert_eq!(limit(), UNSCOPED_LIMIT);
        let e = with_limit(1, || parse(3, r#"{"keys":["a","b","c","d"]}"#)).unwrap_err();
        assert!(e.contains("more than 3"), "{e}");
        assert_eq!(limit(), UNSCOPED_LIMIT);
    }

    #[test]
    fn a_huge_list_stops_at_the_limit() {
        let body = format!(r#"{{"keys":[{}""]}}"#, "\"\",".repeat(1_000_000));
        let e = parse(10, &body).unwrap_err();
        // Refused at the eleventh item, not after reading three megabytes.
        let column: usize = e.rsplit("column ").next().unwrap().parse().unwrap();
        assert!(e.contains("more than 10 items") && column < 64, "{e}");
    }

    #[test]
    fn an_announced_length_beyond_the_limit_is_refused_before_reserving() {
        struct Announcing(usize);
        impl<'de> SeqAccess<'de> for Announcing {
            type Error = serde::de::value::Error;
            fn next_element_seed<T: serde::de::DeserializeSeed<'de>>(
                &mut self,
                _: T,
            ) -> Result<Option<T::Value>, Self::Error> {
                Ok(None)
            }
            fn size_hint(&self) -> Option<usize> {
                Some(self.0)
            }
        }
        let e = Bounded::<String>(8, PhantomData)
            .visit_seq(Announcing(usize::MAX))
            .unwrap_err();
        assert!(e.to_string().contains("more than 8"), "{e}");
        let v = Bounded::<String>(usize::MAX, PhantomData)
            .visit_seq(Announcing(usize::MAX / 2))
            .unwrap();
        assert!(v.capacity() <= MAX_PREALLOC);
    }
}
