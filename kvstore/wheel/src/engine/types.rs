//! The small classes of `moongate.engine`: `TransferOpcode`, `TransferNotify` (and its
//! wire form).

use pyo3::prelude::*;
use transfer::Op;

/// Direction of a transfer (`TransferOpcode.Read` = 0, `TransferOpcode.Write` = 1).
#[pyclass(module = "moongate.engine", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOpcode {
    /// Copy from the peer into local memory.
    Read = 0,
    /// Copy from local memory into the peer.
    Write = 1,
}

#[pymethods]
impl TransferOpcode {
    /// The member's name, as pybind11 enums have it.
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            Self::Read => "Read",
            Self::Write => "Write",
        }
    }

    /// The member's value.
    #[getter]
    fn value(&self) -> i64 {
        *self as i64
    }
}

impl From<TransferOpcode> for Op {
    fn from(o: TransferOpcode) -> Op {
        match o {
            TransferOpcode::Read => Op::Read,
            TransferOpcode::Write => Op::Write,
        }
    }
}

/// A notification sent with a transfer and received by `get_notifies`.
#[pyclass(module = "moongate.engine", get_all, set_all, from_py_object)]
#[derive(Clone, Debug, Default)]
pub struct TransferNotify {
    /// Who sent it (Mooncake: the sender's segment name, by convention).
    pub name: String,
    /// The message.
    pub msg: String,
}

#[pymethods]
impl TransferNotify {
    #[new]
    #[pyo3(signature = (name = String::new(), msg = String::new()))]
    fn py_new(name: String, msg: String) -> Self {
        Self { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// On the wire a notification is `name`, a NUL byte, `msg` (a Rust engine's plain message,
/// with no NUL, arrives with its sender's segment name as `name`).
pub(super) fn encode_notify(n: &TransferNotify) -> Vec<u8> {
    let mut v = Vec::with_capacity(n.name.len() + 1 + n.msg.len());
    v.extend_from_slice(n.name.as_bytes());
    v.push(0);
    v.extend_from_slice(n.msg.as_bytes());
    v
}

pub(super) fn decode_notify(from: &str, message: &[u8]) -> TransferNotify {
    match message.iter().position(|&b| b == 0) {
        Some(i) => TransferNotify {
            name: String::from_utf8_lossy(&message[..i]).into_owned(),
            msg: String::from_utf8_lossy(&message[i + 1..]).into_owned(),
        },
        None => TransferNotify {
            name: from.to_owned(),
            msg: String::from_utf8_lossy(message).into_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_round_trip() {
        let n = TransferNotify {
            name: "a:1".into(),
            msg: "done".into(),
        };
        let back = decode_notify("x", &encode_notify(&n));
        assert_eq!((back.name.as_str(), back.msg.as_str()), ("a:1", "done"));
        let plain = decode_notify("rust:2", b"hello");
        assert_eq!(
            (plain.name.as_str(), plain.msg.as_str()),
            ("rust:2", "hello")
        );
    }
}
