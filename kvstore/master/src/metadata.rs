//! The transfer-metadata store: a small key -> bytes map, compatible with Mooncake's HTTP
//! metadata server (`GET/PUT/DELETE /metadata?key=...`), which `transfer` uses to publish
//! and find segment descriptors. Values are opaque bytes returned exactly as stored.

use std::collections::HashMap;

use bytes::Bytes;
use parking_lot::RwLock;

use openapi::master::{MasterError, MasterResult};

/// Key -> value store with bounded size.
#[derive(Debug)]
pub struct MetadataStore {
    map: RwLock<HashMap<String, Bytes>>,
    max_entries: usize,
    max_value_bytes: usize,
}

impl MetadataStore {
    /// A store of at most `max_entries` values of at most `max_value_bytes` each.
    pub fn new(max_entries: usize, max_value_bytes: usize) -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            max_entries,
            max_value_bytes,
        }
    }

    /// Largest value accepted, in bytes.
    pub fn max_value_bytes(&self) -> usize {
        self.max_value_bytes
    }

    /// The value last stored under `key`.
    pub fn get(&self, key: &str) -> MasterResult<Bytes> {
        check(key)?;
        self.map
            .read()
            .get(key)
            .cloned()
            .ok_or_else(|| MasterError::ObjectNotFound(format!("metadata {key}")))
    }

    /// Stores `value` under `key`, replacing any previous value.
    pub fn put(&self, key: &str, value: Bytes) -> MasterResult<()> {
        check(key)?;
        if value.len() > self.max_value_bytes {
            return Err(MasterError::InvalidParams(format!(
                "metadata value is {} bytes, the limit is {}",
                value.len(),
                self.max_value_bytes
            )));
        }
        let mut map = self.map.write();
        if map.len() >= self.max_entries && !map.contains_key(key) {
            return Err(MasterError::NoAvailableHandle(format!(
                "metadata store holds its limit of {} entries",
                self.max_entries
            )));
        }
        map.insert(key.to_string(), value);
        Ok(())
    }

    /// Removes `key`.
    pub fn delete(&self, key: &str) -> MasterResult<()> {
        check(key)?;
        self.map
            .write()
            .remove(key)
            .map(|_| ())
            .ok_or_else(|| MasterError::ObjectNotFound(format!("metadata {key}")))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }
}

fn check(key: &str) -> MasterResult<()> {
    if key.is_empty() {
        return Err(MasterError::InvalidKey("missing key parameter".into()));
    }
    if key.len() > 4096 {
        return Err(MasterError::InvalidKey(
            "metadata key longer than 4096 bytes".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_exact_bytes_and_bounds_size() {
        let s = MetadataStore::new(2, 4);
        assert!(matches!(s.get("a"), Err(MasterError::ObjectNotFound(_))));
        s.put("a", Bytes::from_static(b"\x00\xff")).unwrap();
        assert_eq!(&s.get("a").unwrap()[..], b"\x00\xff");
        assert!(matches!(
            s.put("a", Bytes::from_static(b"12345")),
            Err(MasterError::InvalidParams(_))
        ));
        assert_eq!(
            &s.get("a").unwrap()[..],
            b"\x00\xff",
            "refused put changes nothing"
        );
        s.put("b", Bytes::new()).unwrap();
        assert!(matches!(
            s.put("c", Bytes::new()),
            Err(MasterError::NoAvailableHandle(_))
        ));
        s.put("b", Bytes::from_static(b"x")).unwrap();
        s.delete("a").unwrap();
        assert!(matches!(s.delete("a"), Err(MasterError::ObjectNotFound(_))));
        assert!(matches!(s.get(""), Err(MasterError::InvalidKey(_))));
        assert_eq!(s.len(), 1);
    }
}
