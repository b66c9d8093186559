//! The master's one error type: Mooncake Store's error names and numeric codes
//! (`mooncake-store/include/types.h`, `ErrorCode`), each classified once into an HTTP status.

/// Result of a master operation.
pub type MasterResult<T> = Result<T, MasterError>;

/// Everything a master operation can refuse or fail with. The payload says which key,
/// segment, client or parameter was at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MasterError {
    /// A bug or broken invariant inside the master.
    #[error("internal error: {0}")]
    InternalError(String),
    /// No mounted segment has that name.
    #[error("segment not found: {0}")]
    SegmentNotFound(String),
    /// A segment of that name is already mounted (by another client, or with other geometry).
    #[error("segment already exists: {0}")]
    SegmentAlreadyExists(String),
    /// The master does not know that client.
    #[error("client not found: {0}")]
    ClientNotFound(String),
    /// No segment has room for the object (after eviction was tried).
    #[error("no available handle: {0}")]
    NoAvailableHandle(String),
    /// The key is empty, too long, or otherwise unusable.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// A parameter is out of range or malformed (sizes, counts, regex, JSON).
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// The client may not do this (it did not start the put, or does not own the segment).
    #[error("illegal client: {0}")]
    IllegalClient(String),
    /// The write cannot change state this way (e.g. revoking a completed object).
    #[error("invalid write: {0}")]
    InvalidWrite(String),
    /// The object is still being written (PROCESSING); it is not readable yet.
    #[error("replica is not ready: {0}")]
    ReplicaIsNotReady(String),
    /// No object has that key.
    #[error("object not found: {0}")]
    ObjectNotFound(String),
    /// An object with that key exists (or is being written).
    #[error("object already exists: {0}")]
    ObjectAlreadyExists(String),
    /// A read lease on the object is live; it cannot be removed now.
    #[error("object has lease: {0}")]
    ObjectHasLease(String),
    /// The host requires an admin API key (`Authorization: Bearer <key>`) and the request
    /// carried none or a wrong one. Moongate's own code: Mooncake has no authentication.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The host serves this route to some callers only (an admin route of a host without an
    /// admin key answers loopback callers only). Moongate's own code.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// An HA master cannot serve this now: it is not the leader and knows none, or it
    /// could not make the change durable in etcd in time (nothing was acknowledged).
    /// Retryable. Moongate's own code.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The reservation a commit names does not exist (never made for this client, used,
    /// expired, on an unmounted segment, or made by a master that has since restarted or
    /// lost leadership). The client puts the value the two-request way. Moongate's own code.
    #[error("reservation not found: {0}")]
    ReservationNotFound(String),
}

impl MasterError {
    /// Mooncake's numeric code (`ErrorCode` in `types.h`); stable on the wire.
    pub fn code(&self) -> i32 {
        match self {
            Self::InternalError(_) => -1,
            Self::SegmentNotFound(_) => -101,
            Self::SegmentAlreadyExists(_) => -102,
            Self::ClientNotFound(_) => -103,
            Self::NoAvailableHandle(_) => -200,
            Self::InvalidKey(_) => -400,
            Self::InvalidParams(_) => -600,
            Self::IllegalClient(_) => -601,
            Self::InvalidWrite(_) => -700,
            Self::ReplicaIsNotReady(_) => -703,
            Self::ObjectNotFound(_) => -704,
            Self::ObjectAlreadyExists(_) => -705,
            Self::ObjectHasLease(_) => -706,
            // Outside every range Mooncake's `ErrorCode` uses.
            Self::Unauthorized(_) => -2001,
            Self::Forbidden(_) => -2002,
            Self::Unavailable(_) => -2003,
            Self::ReservationNotFound(_) => -2004,
        }
    }

    /// Mooncake's name for the code, e.g. `OBJECT_NOT_FOUND`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::InternalError(_) => "INTERNAL_ERROR",
            Self::SegmentNotFound(_) => "SEGMENT_NOT_FOUND",
            Self::SegmentAlreadyExists(_) => "SEGMENT_ALREADY_EXISTS",
            Self::ClientNotFound(_) => "CLIENT_NOT_FOUND",
            Self::NoAvailableHandle(_) => "NO_AVAILABLE_HANDLE",
            Self::InvalidKey(_) => "INVALID_KEY",
            Self::InvalidParams(_) => "INVALID_PARAMS",
            Self::IllegalClient(_) => "ILLEGAL_CLIENT",
            Self::InvalidWrite(_) => "INVALID_WRITE",
            Self::ReplicaIsNotReady(_) => "REPLICA_IS_NOT_READY",
            Self::ObjectNotFound(_) => "OBJECT_NOT_FOUND",
            Self::ObjectAlreadyExists(_) => "OBJECT_ALREADY_EXISTS",
            Self::ObjectHasLease(_) => "OBJECT_HAS_LEASE",
            Self::Unauthorized(_) => "UNAUTHORIZED",
            Self::Forbidden(_) => "FORBIDDEN",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::ReservationNotFound(_) => "RESERVATION_NOT_FOUND",
        }
    }

    /// The HTTP status this error is answered with; the one place errors are classified.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::InternalError(_) => 500,
            Self::InvalidKey(_) | Self::InvalidParams(_) => 400,
            Self::Unauthorized(_) => 401,
            Self::IllegalClient(_) | Self::Forbidden(_) => 403,
            Self::SegmentNotFound(_)
            | Self::ClientNotFound(_)
            | Self::ObjectNotFound(_)
            | Self::ReservationNotFound(_) => 404,
            Self::SegmentAlreadyExists(_)
            | Self::InvalidWrite(_)
            | Self::ReplicaIsNotReady(_)
            | Self::ObjectAlreadyExists(_)
            | Self::ObjectHasLease(_) => 409,
            Self::NoAvailableHandle(_) => 507,
            Self::Unavailable(_) => 503,
        }
    }

    /// Rebuilds the error a master answered with (`type` and `message` of the wire
    /// envelope): the inverse of [`MasterError::name`] and `Display`. An unknown name (a
    /// newer master) becomes `InternalError` naming it.
    pub fn from_wire(kind: &str, message: &str) -> Self {
        let make: fn(String) -> Self = match kind {
            "INTERNAL_ERROR" => Self::InternalError,
            "SEGMENT_NOT_FOUND" => Self::SegmentNotFound,
            "SEGMENT_ALREADY_EXISTS" => Self::SegmentAlreadyExists,
            "CLIENT_NOT_FOUND" => Self::ClientNotFound,
            "NO_AVAILABLE_HANDLE" => Self::NoAvailableHandle,
            "INVALID_KEY" => Self::InvalidKey,
            "INVALID_PARAMS" => Self::InvalidParams,
            "ILLEGAL_CLIENT" => Self::IllegalClient,
            "INVALID_WRITE" => Self::InvalidWrite,
            "REPLICA_IS_NOT_READY" => Self::ReplicaIsNotReady,
            "OBJECT_NOT_FOUND" => Self::ObjectNotFound,
            "OBJECT_ALREADY_EXISTS" => Self::ObjectAlreadyExists,
            "OBJECT_HAS_LEASE" => Self::ObjectHasLease,
            "UNAUTHORIZED" => Self::Unauthorized,
            "FORBIDDEN" => Self::Forbidden,
            "UNAVAILABLE" => Self::Unavailable,
            "RESERVATION_NOT_FOUND" => Self::ReservationNotFound,
            other => return Self::InternalError(format!("{other}: {message}")),
        };
        // The wire message is this type's `Display`: drop the prefix it adds again.
        let prefix = make(String::new()).to_string();
        make(message.strip_prefix(&prefix).unwrap_or(message).to_owned())
    }

    /// Whether the same request may succeed later without change (space freed, lease over,
    /// write finished).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::NoAvailableHandle(_)
                | Self::ReplicaIsNotReady(_)
                | Self::ObjectHasLease(_)
                | Self::Unavailable(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_form_round_trips() {
        let all = [
            MasterError::InternalError("x".into()),
            MasterError::SegmentNotFound("seg-1".into()),
            MasterError::SegmentAlreadyExists("s".into()),
            MasterError::ClientNotFound("c".into()),
            MasterError::NoAvailableHandle("full".into()),
            MasterError::InvalidKey("k".into()),
            MasterError::InvalidParams("p".into()),
            MasterError::IllegalClient("i".into()),
            MasterError::InvalidWrite("w".into()),
            MasterError::ReplicaIsNotReady("r".into()),
            MasterError::ObjectNotFound("key: a b".into()),
            MasterError::ObjectAlreadyExists("e".into()),
            MasterError::ObjectHasLease("l".into()),
            MasterError::Unauthorized("u".into()),
            MasterError::Forbidden("f".into()),
            MasterError::Unavailable("no leader".into()),
            MasterError::ReservationNotFound("reservation 7 of k".into()),
        ];
        for e in all {
            assert_eq!(MasterError::from_wire(e.name(), &e.to_string()), e);
        }
        assert_eq!(
            MasterError::from_wire("NEW_THING", "m"),
            MasterError::InternalError("NEW_THING: m".into())
        );
        assert_eq!(
            MasterError::from_wire("OBJECT_NOT_FOUND", "bare"),
            MasterError::ObjectNotFound("bare".into())
        );
    }

    #[test]
    fn codes_match_mooncake() {
        let all = [
            (MasterError::InternalError(String::new()), -1, 500),
            (MasterError::SegmentNotFound(String::new()), -101, 404),
            (MasterError::SegmentAlreadyExists(String::new()), -102, 409),
            (MasterError::ClientNotFound(String::new()), -103, 404),
            (MasterError::NoAvailableHandle(String::new()), -200, 507),
            (MasterError::InvalidKey(String::new()), -400, 400),
            (MasterError::InvalidParams(String::new()), -600, 400),
            (MasterError::IllegalClient(String::new()), -601, 403),
            (MasterError::InvalidWrite(String::new()), -700, 409),
            (MasterError::ReplicaIsNotReady(String::new()), -703, 409),
            (MasterError::ObjectNotFound(String::new()), -704, 404),
            (MasterError::ObjectAlreadyExists(String::new()), -705, 409),
            (MasterError::ObjectHasLease(String::new()), -706, 409),
            (MasterError::Unauthorized(String::new()), -2001, 401),
            (MasterError::Unavailable(String::new()), -2003, 503),
            (MasterError::ReservationNotFound(String::new()), -2004, 404),
        ];
        for (e, code, status) in all {
            assert_eq!((e.code(), e.http_status()), (code, status), "{}", e.name());
        }
    }
}
