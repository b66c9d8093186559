//! Verbs resources (feature `rdma`): opening a device (context, protection domain,
//! completion queue, port attributes), registering memory regions, creating reliable-connection
//! queue pairs and moving them through INIT, RTR and RTS against a peer's endpoint.
//!
//! Lifetimes: a [`Device`] (context, protection domain, completion queue) lives in an
//! `Arc` that every memory region ([`MrHandle`]) and queue pair ([`Qp`]) registered on it
//! holds, so the context outlives everything created from it, whatever order the engine's
//! parts are dropped in. These calls go to the kernel driver and can take milliseconds:
//! callers run them off the async threads (`home::run_blocking`).
//!
//! Not exercised on the machines this was written on (no RDMA in their kernel): compiled
//! and linted only. See `verbs` for the data path.

use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ibverbs_sys as ffi;
use tokio::sync::Semaphore;

use crate::error::{Result, TransferError};
use crate::home::run_blocking;
use crate::rdma::{QpEndpoint, gid_from_hex};

pub(crate) const PORT: u8 = 1;
const CQ_DEPTH: i32 = 4096;
pub(crate) const MAX_SEND_WR: u32 = 256;

/// Names of the devices `ibv_get_device_list` reports.
pub(crate) fn device_names() -> std::result::Result<Vec<String>, String> {
    let list = ibverbs::devices().map_err(|e| format!("ibv_get_device_list failed: {e}"))?;
    let names: Vec<String> = list
        .iter()
        .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    if names.is_empty() {
        Err("no RDMA devices found".into())
    } else {
        Ok(names)
    }
}

pub(crate) fn verbs_err(what: &str, detail: impl std::fmt::Display) -> TransferError {
    TransferError::TransportUnavailable {
        transport: "rdma",
        reason: format!("{what}: {detail}"),
    }
}

/// An opened device: context, protection domain, completion queue, port attributes.
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) ctx: *mut ffi::ibv_context,
    pub(crate) pd: *mut ffi::ibv_pd,
    pub(crate) cq: *mut ffi::ibv_cq,
    pub(crate) lid: u16,
    pub(crate) gid: Option<[u8; 16]>,
    pub(crate) gid_index: u8,
    pub(crate) mtu: ffi::ibv_mtu,
}

// SAFETY: verbs objects are thread safe (libibverbs serialises per object internally); the
// pointers are owned by this struct and released once, in Drop, which runs only after every
// MR, QP and poller (each holding an `Arc<Device>`) is gone.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: cq was created by this device; no queue pair uses it any more (each holds
        // an Arc of this device) and its poller thread, which holds one too, has stopped.
        unsafe { ffi::ibv_destroy_cq(self.cq) };
        // SAFETY: every MR and QP of this PD is gone (each holds an Arc of this device).
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
        // SAFETY: the context is closed once, last.
        unsafe { ffi::ibv_close_device(self.ctx) };
    }
}

pub(crate) fn open_device(name: &str, gid_index: u8) -> Result<Device> {
    let mut n = 0i32;
    // SAFETY: n is a valid out pointer.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(verbs_err(
            "ibv_get_device_list",
            std::io::Error::last_os_error(),
        ));
    }
    let mut ctx = std::ptr::null_mut();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n device pointers; i < n.
        let dev = unsafe { *list.wrapping_add(i) };
        // SAFETY: dev is a device of the live list; the name is a NUL-terminated string.
        let dname = unsafe { ffi::ibv_get_device_name(dev) };
        if dname.is_null() {
            continue;
        }
        // SAFETY: non-null, NUL-terminated, valid while the list is.
        if unsafe { CStr::from_ptr(dname) }.to_string_lossy() == name {
            // SAFETY: dev is valid while the list is; opening does not need the list after.
            ctx = unsafe { ffi::ibv_open_device(dev) };
            break;
        }
    }
    // SAFETY: list came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(verbs_err(
            "ibv_open_device",
            format!("device {name} not found or not openable"),
        ));
    }
    // SAFETY: port attributes are plain data; zero is a valid start.
    let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is open; attr is a valid out pointer of the layout the call fills.
    let rc =
        unsafe { ffi::ibv_query_port(ctx, PORT, (&mut attr as *mut ffi::ibv_port_attr).cast()) };
    let fail = |what: &str, detail: String| {
        // SAFETY: ctx is open and closed once on this error path.
        unsafe { ffi::ibv_close_device(ctx) };
        Err(verbs_err(what, detail))
    };
    if rc != 0 || attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
        return fail(
            "ibv_query_port",
            format!("{name} port {PORT} is not active (rc {rc})"),
        );
    }
    let gid = if attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8 {
        // SAFETY: ibv_gid is plain data.
        let mut g: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; g is a valid out pointer.
        if unsafe { ffi::ibv_query_gid(ctx, PORT, gid_index as i32, &mut g) } != 0 {
            return fail(
                "ibv_query_gid",
                format!("{name} has no GID at index {gid_index}"),
            );
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Some(unsafe { g.raw })
    } else {
        None
    };
    // SAFETY: ctx is open.
    let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return fail("ibv_alloc_pd", std::io::Error::last_os_error().to_string());
    }
    // SAFETY: ctx is open; no completion channel, no context pointer.
    let cq =
        unsafe { ffi::ibv_create_cq(ctx, CQ_DEPTH, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    if cq.is_null() {
        // SAFETY: pd was allocated above and is released once here.
        unsafe { ffi::ibv_dealloc_pd(pd) };
        return fail("ibv_create_cq", std::io::Error::last_os_error().to_string());
    }
    Ok(Device {
        name: name.to_owned(),
        ctx,
        pd,
        cq,
        lid: attr.lid,
        gid,
        gid_index,
        mtu: attr.active_mtu,
    })
}

/// A memory region registered with one device (deregistered on drop, before the device
/// it holds can close).
pub(crate) struct MrHandle {
    pub(crate) mr: *mut ffi::ibv_mr,
    pub(crate) _dev: Arc<Device>,
}

// SAFETY: the MR pointer is owned here and only released in Drop.
unsafe impl Send for MrHandle {}
// SAFETY: as above.
unsafe impl Sync for MrHandle {}

impl Drop for MrHandle {
    fn drop(&mut self) {
        // SAFETY: mr came from ibv_reg_mr and is deregistered once, while its device (held
        // by `_dev`) is open. The registration entry drops its MRs before its memory (see
        // `registry::LocalEntry`), so the memory is still mapped here.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// A reliable-connection queue pair (destroyed on drop, before the device it holds).
pub(crate) struct Qp {
    pub(crate) qp: *mut ffi::ibv_qp,
    pub(crate) num: u32,
    pub(crate) psn: u32,
    pub(crate) device: usize,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) broken: AtomicBool,
    /// Moves this queue pair to the error state (flushing its work requests), off the
    /// async threads: how a timed-out RDMA READ is stopped from landing.
    pub(crate) abort: crate::op::Abort,
    pub(crate) _dev: Arc<Device>,
}

// SAFETY: posting to one QP from several threads is allowed by libibverbs; the pointer is
// owned here and destroyed once in Drop.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once while its device (held by `_dev`)
        // is open; in-flight work requests hold an Arc to this Qp, so none is outstanding.
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}

pub(crate) fn access_flags() -> u32 {
    (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
        .0
}

fn modify(
    qp: *mut ffi::ibv_qp,
    attr: &mut ffi::ibv_qp_attr,
    mask: ffi::ibv_qp_attr_mask,
    what: &str,
) -> Result<()> {
    // SAFETY: qp is a live queue pair; attr is a valid attribute struct for the mask.
    let rc = unsafe { ffi::ibv_modify_qp(qp, attr, mask.0 as i32) };
    if rc != 0 {
        Err(verbs_err(what, std::io::Error::from_raw_os_error(rc)))
    } else {
        Ok(())
    }
}

/// Moves `qp` to the error state: every work request still queued completes with a flush
/// error, and nothing more is read or written through it.
pub(crate) fn set_error(qp: *mut ffi::ibv_qp) {
    // SAFETY: plain data.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
    let _ = modify(
        qp,
        &mut attr,
        ffi::ibv_qp_attr_mask::IBV_QP_STATE,
        "QP to ERR",
    );
}

/// A raw QP pointer moved into the abort closure (used only while the `Qp` lives: the
/// closure upgrades a `Weak` first).
struct QpPtr(*mut ffi::ibv_qp);
// SAFETY: modifying a QP from any thread is allowed by libibverbs.
unsafe impl Send for QpPtr {}
// SAFETY: as above.
unsafe impl Sync for QpPtr {}

pub(crate) fn create_qp(dev: &Arc<Device>, device: usize) -> Result<Arc<Qp>> {
    // SAFETY: plain data; zero is a valid start.
    let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    init.send_cq = dev.cq;
    init.recv_cq = dev.cq;
    init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
    init.cap = ffi::ibv_qp_cap {
        max_send_wr: MAX_SEND_WR,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // SAFETY: pd and cq belong to this device; init is valid.
    let qp = unsafe { ffi::ibv_create_qp(dev.pd, &mut init) };
    if qp.is_null() {
        return Err(verbs_err("ibv_create_qp", std::io::Error::last_os_error()));
    }
    // SAFETY: qp is non-null and live.
    let num = unsafe { (*qp).qp_num };
    let q = Arc::new_cyclic(|me: &std::sync::Weak<Qp>| {
        let (me, raw) = (me.clone(), QpPtr(qp));
        Qp {
            qp,
            num,
            psn: rand::random::<u32>() & 0xff_ffff,
            device,
            slots: Arc::new(Semaphore::new(MAX_SEND_WR as usize)),
            broken: AtomicBool::new(false),
            abort: Arc::new(move || {
                if let Some(q) = me.upgrade() {
                    q.broken.store(true, std::sync::atomic::Ordering::Release);
                    let raw = &raw;
                    run_blocking(|| set_error(raw.0));
                }
            }),
            _dev: dev.clone(),
        }
    });
    // SAFETY: plain data.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = PORT;
    attr.qp_access_flags = access_flags();
    use ffi::ibv_qp_attr_mask as M;
    modify(
        qp,
        &mut attr,
        M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
        "QP to INIT",
    )?;
    Ok(q)
}

/// Moves a queue pair to RTR then RTS against `remote`.
pub(crate) fn connect_qp(q: &Qp, dev: &Device, remote: &QpEndpoint) -> Result<()> {
    use ffi::ibv_qp_attr_mask as M;
    // SAFETY: plain data.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
    attr.path_mtu = dev.mtu;
    attr.dest_qp_num = remote.qp_num;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 16;
    attr.min_rnr_timer = 12;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.port_num = PORT;
    if let Some(g) = &remote.gid {
        let raw = gid_from_hex(g).map_err(|e| verbs_err("remote GID", e))?;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = ffi::ibv_gid { raw };
        attr.ah_attr.grh.sgid_index = dev.gid_index;
        attr.ah_attr.grh.hop_limit = 0xff;
    }
    let mask = M::IBV_QP_STATE
        | M::IBV_QP_AV
        | M::IBV_QP_PATH_MTU
        | M::IBV_QP_DEST_QPN
        | M::IBV_QP_RQ_PSN
        | M::IBV_QP_MAX_DEST_RD_ATOMIC
        | M::IBV_QP_MIN_RNR_TIMER;
    modify(q.qp, &mut attr, mask, "QP to RTR")?;
    // SAFETY: plain data.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = q.psn;
    attr.max_rd_atomic = 16;
    let mask = M::IBV_QP_STATE
        | M::IBV_QP_TIMEOUT
        | M::IBV_QP_RETRY_CNT
        | M::IBV_QP_RNR_RETRY
        | M::IBV_QP_SQ_PSN
        | M::IBV_QP_MAX_QP_RD_ATOMIC;
    modify(q.qp, &mut attr, mask, "QP to RTS")
}
