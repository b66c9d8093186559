//! The verbs data path (feature `rdma`): devices, memory-region registration, RC queue pairs
//! connected over the TCP control connection, one-sided RDMA WRITE / READ of slices spread
//! over device pairs, completion polling, retry on another device pair.
//!
//! Not exercised on the machines this was written on: their kernel has no RDMA, so
//! `ibv_get_device_list` fails with `ENOSYS` and no device can be opened. This code is
//! compiled and linted in CI; the parts that do not need a device (handshake encoding,
//! device-pair choice, slicing, detection and fallback) are tested in `rdma`.

use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use ibverbs_sys as ffi;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use crate::engine::batch::{BatchState, Completion, Op};
use crate::engine::config::EngineConfig;
use crate::error::{RemoteRange, Result, TransferError};
use crate::memory::MemoryRegion;
use crate::rdma::{
    HANDSHAKE_VERSION, QpEndpoint, RdmaHandshake, RdmaPath, gid_from_hex, gid_to_hex, plan_slices,
};
use crate::segment::{RdmaDeviceEndpoint, RdmaKey, SegmentDescriptor};
use crate::tcp::client::{Peer, status_error};
use crate::tcp::frame::{Opcode, Status};
use crate::tcp::server::RdmaAcceptor;

const PORT: u8 = 1;
const CQ_DEPTH: i32 = 4096;
const MAX_SEND_WR: u32 = 256;
/// Queue pairs accepted from peers kept at most (the oldest is destroyed beyond this).
const MAX_ACCEPTED: usize = 4096;

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

fn verbs_err(what: &str, detail: impl std::fmt::Display) -> TransferError {
    TransferError::TransportUnavailable {
        transport: "rdma",
        reason: format!("{what}: {detail}"),
    }
}

/// An opened device: context, protection domain, completion queue, port attributes.
struct Device {
    name: String,
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    cq: *mut ffi::ibv_cq,
    lid: u16,
    gid: Option<[u8; 16]>,
    gid_index: u8,
    mtu: ffi::ibv_mtu,
}

// SAFETY: verbs objects are thread safe (libibverbs serialises per object internally); the
// pointers are owned by this struct and released once, in Drop, after the pollers stopped.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: cq was created by this device and no queue pair uses it any more (they are
        // destroyed before the transport drops its devices).
        unsafe { ffi::ibv_destroy_cq(self.cq) };
        // SAFETY: every MR and QP of this PD is gone (they hold the transport alive).
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
        // SAFETY: the context is closed once, last.
        unsafe { ffi::ibv_close_device(self.ctx) };
    }
}

fn open_device(name: &str, gid_index: u8) -> Result<Device> {
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

/// A memory region registered with one device (deregistered on drop).
pub(crate) struct MrHandle {
    mr: *mut ffi::ibv_mr,
    pub(crate) device: usize,
    pub(crate) lkey: u32,
}

// SAFETY: the MR pointer is owned here and only released in Drop.
unsafe impl Send for MrHandle {}
// SAFETY: as above.
unsafe impl Sync for MrHandle {}

impl Drop for MrHandle {
    fn drop(&mut self) {
        // SAFETY: mr came from ibv_reg_mr and is deregistered once. The registration entry
        // holding it lives as long as any transfer using the memory.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// A reliable-connection queue pair.
struct Qp {
    qp: *mut ffi::ibv_qp,
    num: u32,
    psn: u32,
    device: usize,
    slots: Arc<Semaphore>,
    broken: AtomicBool,
}

// SAFETY: posting to one QP from several threads is allowed by libibverbs; the pointer is
// owned here and destroyed once in Drop.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once; in-flight work requests hold an
        // Arc to this Qp, so none is outstanding.
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}

fn access_flags() -> u32 {
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

fn create_qp(dev: &Device, device: usize) -> Result<Qp> {
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
    let q = Qp {
        qp,
        num,
        psn: rand::random::<u32>() & 0xff_ffff,
        device,
        slots: Arc::new(Semaphore::new(MAX_SEND_WR as usize)),
        broken: AtomicBool::new(false),
    };
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
fn connect_qp(q: &Qp, dev: &Device, remote: &QpEndpoint) -> Result<()> {
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

/// One slice in flight (or waiting to be retried on another path).
struct SliceJob {
    completion: Completion,
    op: Op,
    local: u64,
    remote: u64,
    len: u32,
    paths: Arc<Vec<RdmaPath>>,
    path: usize,
    attempts: usize,
    peer_engine: u64,
    control: Arc<Peer>,
    lkeys: Arc<Vec<Option<u32>>>,
    deadline: Instant,
    qp: Option<Arc<Qp>>,
    permit: Option<OwnedSemaphorePermit>,
}

impl SliceJob {
    /// Moves to the next path; false when every path was tried.
    fn next_path(&mut self) -> bool {
        self.attempts += 1;
        self.path = (self.path + 1) % self.paths.len();
        self.qp = None;
        self.permit = None;
        self.attempts < self.paths.len()
    }
}

/// In-flight slices by work-request id.
#[derive(Default)]
struct Pending {
    slots: Mutex<(Vec<Option<SliceJob>>, Vec<usize>)>,
}

impl Pending {
    fn insert(&self, job: SliceJob) -> u64 {
        let mut g = self.slots.lock();
        let (slots, free) = &mut *g;
        match free.pop() {
            Some(i) => {
                slots[i] = Some(job);
                i as u64
            }
            None => {
                slots.push(Some(job));
                (slots.len() - 1) as u64
            }
        }
    }

    fn take(&self, id: u64) -> Option<SliceJob> {
        let mut g = self.slots.lock();
        let (slots, free) = &mut *g;
        let job = slots.get_mut(id as usize)?.take();
        if job.is_some() {
            free.push(id as usize);
        }
        job
    }
}

type ConnKey = (u64, usize, String);

/// The RDMA transport of one engine.
pub(crate) struct Transport {
    devices: Vec<Device>,
    conns: Mutex<HashMap<ConnKey, Arc<Qp>>>,
    connecting: tokio::sync::Mutex<()>,
    accepted: Mutex<VecDeque<Arc<Qp>>>,
    pending: Arc<Pending>,
    retry_tx: mpsc::UnboundedSender<SliceJob>,
    running: Arc<AtomicBool>,
    pollers: Mutex<Vec<JoinHandle<()>>>,
    slice_size: u64,
    control_timeout: Duration,
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Release);
        for h in self.pollers.lock().drain(..) {
            let _ = h.join();
        }
        self.accepted.lock().clear();
        self.conns.lock().clear();
    }
}

/// A completion-queue pointer handed to a poller thread.
struct CqPtr(*mut ffi::ibv_cq);
// SAFETY: polling a CQ from one dedicated thread is allowed; the transport joins the thread
// before destroying the CQ.
unsafe impl Send for CqPtr {}

impl Transport {
    /// Opens `devices` and starts one completion poller per device.
    pub(crate) fn open(devices: &[String], config: &EngineConfig) -> Result<Arc<Self>> {
        let opened = devices
            .iter()
            .map(|d| open_device(d, config.rdma_gid_index))
            .collect::<Result<Vec<_>>>()?;
        let (retry_tx, retry_rx) = mpsc::unbounded_channel();
        let t = Arc::new(Self {
            devices: opened,
            conns: Mutex::new(HashMap::new()),
            connecting: tokio::sync::Mutex::new(()),
            accepted: Mutex::new(VecDeque::new()),
            pending: Arc::new(Pending::default()),
            retry_tx,
            running: Arc::new(AtomicBool::new(true)),
            pollers: Mutex::new(Vec::new()),
            slice_size: config.rdma_slice_size as u64,
            control_timeout: config.connect_timeout,
        });
        for dev in &t.devices {
            let (cq, pending, running, retry) = (
                CqPtr(dev.cq),
                t.pending.clone(),
                t.running.clone(),
                t.retry_tx.clone(),
            );
            let h = std::thread::Builder::new()
                .name(format!("rdma-poll-{}", dev.name))
                .spawn(move || poll_loop(cq, pending, running, retry))
                .map_err(|e| verbs_err("spawning the completion poller", e))?;
            t.pollers.lock().push(h);
        }
        tokio::spawn(retry_loop(Arc::downgrade(&t), retry_rx));
        Ok(t)
    }

    pub(crate) fn device_names(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.name.clone()).collect()
    }

    pub(crate) fn endpoints(&self) -> Vec<RdmaDeviceEndpoint> {
        self.devices
            .iter()
            .map(|d| RdmaDeviceEndpoint {
                device: d.name.clone(),
                lid: d.lid,
                gid: d.gid.as_ref().map(gid_to_hex),
            })
            .collect()
    }

    /// Registers `region` with every device: remote keys for the descriptor, local handles.
    pub(crate) fn register(&self, region: &MemoryRegion) -> Result<(Vec<RdmaKey>, Vec<MrHandle>)> {
        let mut keys = Vec::new();
        let mut mrs = Vec::new();
        for (i, dev) in self.devices.iter().enumerate() {
            // SAFETY: the region is valid for its length while the MR lives (the MR is held by
            // the registration entry, which holds the region).
            let mr = unsafe {
                ffi::ibv_reg_mr(
                    dev.pd,
                    region.as_ptr().cast(),
                    region.len(),
                    access_flags() as i32,
                )
            };
            if mr.is_null() {
                return Err(verbs_err("ibv_reg_mr", std::io::Error::last_os_error()));
            }
            // SAFETY: mr is non-null and live.
            let mr_ref = unsafe { &*mr };
            let (lkey, rkey) = (mr_ref.lkey, mr_ref.rkey);
            mrs.push(MrHandle {
                mr,
                device: i,
                lkey,
            });
            keys.push(RdmaKey {
                device: dev.name.clone(),
                rkey,
            });
        }
        Ok((keys, mrs))
    }

    pub(crate) fn acceptor(self: &Arc<Self>) -> Arc<dyn RdmaAcceptor> {
        Arc::new(Acceptor(self.clone()))
    }

    fn endpoint_of(&self, q: &Qp) -> QpEndpoint {
        let d = &self.devices[q.device];
        QpEndpoint {
            device: d.name.clone(),
            lid: d.lid,
            gid: d.gid.as_ref().map(gid_to_hex),
            qp_num: q.num,
            psn: q.psn,
        }
    }

    /// Slices request `idx` over its device pairs and posts the slices.
    pub(crate) async fn submit(
        self: &Arc<Self>,
        batch: &Arc<BatchState>,
        idx: usize,
        paths: Vec<RdmaPath>,
        peer: &SegmentDescriptor,
        control: Arc<Peer>,
    ) {
        let req = &batch.requests[idx];
        let mut lkeys = vec![None; self.devices.len()];
        for mr in &req.local.entry().rdma_mrs {
            lkeys[mr.device] = Some(mr.lkey);
        }
        let lkeys = Arc::new(lkeys);
        let plan = plan_slices(
            req.len as u64,
            self.slice_size,
            paths.len(),
            idx % paths.len().max(1),
        );
        batch.set_slices(idx, plan.len() as u32);
        let paths = Arc::new(paths);
        for s in plan {
            let job = SliceJob {
                completion: batch.completion(idx),
                op: req.op,
                local: req.local_ptr() as u64 + s.offset,
                remote: req.remote_addr + s.offset,
                len: s.len as u32,
                paths: paths.clone(),
                path: s.path,
                attempts: 0,
                peer_engine: peer.engine_id,
                control: control.clone(),
                lkeys: lkeys.clone(),
                deadline: batch.deadline,
                qp: None,
                permit: None,
            };
            self.post(job).await;
        }
    }

    async fn connection(
        &self,
        peer_engine: u64,
        path: &RdmaPath,
        control: &Peer,
    ) -> Result<Arc<Qp>> {
        let key = (peer_engine, path.local, path.remote.clone());
        if let Some(q) = self.conns.lock().get(&key)
            && !q.broken.load(Ordering::Acquire)
        {
            return Ok(q.clone());
        }
        let _guard = self.connecting.lock().await;
        if let Some(q) = self.conns.lock().get(&key)
            && !q.broken.load(Ordering::Acquire)
        {
            return Ok(q.clone());
        }
        let dev = &self.devices[path.local];
        let q = create_qp(dev, path.local)?;
        let hello = RdmaHandshake {
            version: HANDSHAKE_VERSION,
            target_device: path.remote.clone(),
            endpoint: self.endpoint_of(&q),
        };
        let (status, reply) = control
            .call(
                Opcode::RdmaConnect,
                hello.encode(),
                Instant::now() + self.control_timeout,
            )
            .await?;
        if status != Status::Ok {
            let msg = String::from_utf8_lossy(&reply);
            return Err(status_error(
                status,
                "rdma peer",
                RemoteRange::new(0, 0),
                &msg,
            ));
        }
        let answer =
            RdmaHandshake::decode(&reply).map_err(|e| TransferError::protocol("rdma peer", e))?;
        connect_qp(&q, dev, &answer.endpoint)?;
        let q = Arc::new(q);
        self.conns.lock().insert(key, q.clone());
        Ok(q)
    }

    /// Posts a slice on its current path, moving to the next path on failure.
    async fn post(self: &Arc<Self>, mut job: SliceJob) {
        loop {
            if !job.completion.is_live() {
                return;
            }
            let path = job.paths[job.path].clone();
            let qp = match self.connection(job.peer_engine, &path, &job.control).await {
                Ok(q) => q,
                Err(e) => {
                    if job.next_path() {
                        continue;
                    }
                    job.completion.complete(Err(e));
                    return;
                }
            };
            let Some(lkey) = job.lkeys.get(path.local).copied().flatten() else {
                let e =
                    TransferError::invalid("local buffer is not registered with the RDMA device");
                job.completion.complete(Err(e));
                return;
            };
            let permit =
                match tokio::time::timeout_at(job.deadline, qp.slots.clone().acquire_owned()).await
                {
                    Ok(Ok(p)) => p,
                    _ => return, // deadline passed: the batch reports TimedOut
                };
            let (op, local, remote, len, rkey) =
                (job.op, job.local, job.remote, job.len, path.rkey);
            job.qp = Some(qp.clone());
            job.permit = Some(permit);
            let wr_id = self.pending.insert(job);
            match post_one(&qp, wr_id, op, local, lkey, remote, rkey, len) {
                Ok(()) => return,
                Err(e) => {
                    qp.broken.store(true, Ordering::Release);
                    let Some(mut back) = self.pending.take(wr_id) else {
                        return;
                    };
                    if back.next_path() {
                        job = back;
                        continue;
                    }
                    back.completion.complete(Err(e));
                    return;
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn post_one(
    qp: &Qp,
    wr_id: u64,
    op: Op,
    local: u64,
    lkey: u32,
    remote: u64,
    rkey: u32,
    len: u32,
) -> Result<()> {
    let mut sge = ffi::ibv_sge {
        addr: local,
        length: len,
        lkey,
    };
    // SAFETY: plain data; zero is a valid start.
    let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = match op {
        Op::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        Op::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
    };
    wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
        remote_addr: remote,
        rkey,
    };
    let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
    // SAFETY: qp is live and points at its context.
    let ctx = unsafe { (*qp.qp).context };
    // SAFETY: the context outlives its queue pairs; its ops table is set up by the provider.
    let post = unsafe { (*ctx).ops.post_send };
    let Some(post) = post else {
        return Err(verbs_err("ibv_post_send", "provider has no post_send"));
    };
    // SAFETY: wr and sge live across the call; the local range is registered memory kept
    // alive by the batch held in the pending job; the remote range was checked against the
    // peer's descriptor and its rkey.
    let rc = unsafe { post(qp.qp, &mut wr, &mut bad) };
    if rc != 0 {
        Err(verbs_err(
            "ibv_post_send",
            std::io::Error::from_raw_os_error(rc),
        ))
    } else {
        Ok(())
    }
}

/// Polls one device's completion queue until the transport stops.
fn poll_loop(
    cq: CqPtr,
    pending: Arc<Pending>,
    running: Arc<AtomicBool>,
    retry: mpsc::UnboundedSender<SliceJob>,
) {
    // SAFETY: ibv_wc is plain data; zero is a valid value.
    let mut wcs: Vec<ffi::ibv_wc> = (0..32).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut idle = 0u32;
    while running.load(Ordering::Acquire) {
        // SAFETY: the CQ is live until this thread is joined.
        let ctx = unsafe { (*cq.0).context };
        // SAFETY: the context outlives its CQ; its ops table is set up by the provider.
        let poll = unsafe { (*ctx).ops.poll_cq };
        let Some(poll) = poll else { return };
        // SAFETY: wcs has room for 32 entries.
        let n = unsafe { poll(cq.0, wcs.len() as i32, wcs.as_mut_ptr()) };
        if n <= 0 {
            idle += 1;
            if idle > 64 {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        idle = 0;
        for wc in &wcs[..n as usize] {
            let Some(mut job) = pending.take(wc.wr_id()) else {
                continue;
            };
            match wc.error() {
                None => {
                    job.qp = None;
                    job.permit = None;
                    job.completion.complete(Ok(()));
                }
                Some((status, vendor)) => {
                    if let Some(q) = &job.qp {
                        q.broken.store(true, Ordering::Release);
                    }
                    if job.next_path() {
                        if let Err(mpsc::error::SendError(job)) = retry.send(job) {
                            job.completion
                                .complete(Err(verbs_err("RDMA retry", "transport stopped")));
                        }
                    } else {
                        let seg = job.completion.request().segment.name().to_owned();
                        let e = TransferError::unreachable(
                            &seg,
                            format!("RDMA completion status {status} (vendor error {vendor})"),
                        );
                        job.completion.complete(Err(e));
                    }
                }
            }
        }
    }
}

/// Re-posts slices that failed on one device pair on the next one.
async fn retry_loop(transport: Weak<Transport>, mut rx: mpsc::UnboundedReceiver<SliceJob>) {
    while let Some(job) = rx.recv().await {
        let Some(t) = transport.upgrade() else { return };
        t.post(job).await;
    }
}

/// Target side of the handshake: a queue pair per initiator queue pair.
struct Acceptor(Arc<Transport>);

impl RdmaAcceptor for Acceptor {
    fn accept(
        &self,
        peer: SocketAddr,
        payload: &[u8],
    ) -> std::result::Result<Vec<u8>, (Status, String)> {
        let t = &self.0;
        let hello = RdmaHandshake::decode(payload).map_err(|e| (Status::BadRequest, e))?;
        let Some(idx) = t.devices.iter().position(|d| d.name == hello.target_device) else {
            return Err((
                Status::Unsupported,
                format!("no RDMA device {} here", hello.target_device),
            ));
        };
        let dev = &t.devices[idx];
        let q = create_qp(dev, idx).map_err(|e| (Status::Unsupported, e.to_string()))?;
        connect_qp(&q, dev, &hello.endpoint).map_err(|e| (Status::Unsupported, e.to_string()))?;
        let reply = RdmaHandshake {
            version: HANDSHAKE_VERSION,
            target_device: hello.endpoint.device.clone(),
            endpoint: t.endpoint_of(&q),
        };
        tracing::debug!(%peer, device = %dev.name, qp = q.num, "accepted RDMA queue pair");
        let mut accepted = t.accepted.lock();
        accepted.push_back(Arc::new(q));
        while accepted.len() > MAX_ACCEPTED {
            accepted.pop_front();
        }
        Ok(reply.encode())
    }
}
