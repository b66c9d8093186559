//! The verbs data path (feature `rdma`): memory-region registration, RC queue pairs (see
//! `device`) connected over the TCP control connection, one-sided RDMA WRITE / READ of slices spread
//! over device pairs, completion polling, retry on another device pair.
//!
//! Not exercised on the machines this was written on: their kernel has no RDMA, so
//! `ibv_get_device_list` fails with `ENOSYS` and no device can be opened. This code is
//! compiled and linted in CI; the parts that do not need a device (handshake encoding,
//! device-pair choice, slicing, detection and fallback) are tested in `rdma`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use ibverbs_sys as ffi;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;

use crate::auth::PeerIdentity;
use crate::config::EngineConfig;
use crate::error::{RemoteRange, Result, TransferError};
use crate::home::run_blocking;
use crate::memory::MemoryRegion;
use crate::op::{BatchState, Completion, Landing, Op};
use crate::rdma::device::{
    Device, Qp, access_flags, connect_qp, create_qp, open_device, verbs_err,
};
use crate::rdma::{
    HANDSHAKE_VERSION, QpEndpoint, RdmaHandshake, RdmaPath, gid_to_hex, plan_slices,
};
use crate::registry::NicRegistration;
use crate::segment::{RdmaDeviceEndpoint, RdmaKey, SegmentDescriptor};
use crate::tcp::client::{Peer, status_error};
use crate::tcp::server::RdmaAcceptor;
use crate::wire::{Opcode, Status};

use crate::rdma::device::MrHandle;
pub(crate) use crate::rdma::device::device_names;

/// Queue pairs accepted from one peer (by its authenticated name) kept at most: the peer's
/// oldest is destroyed beyond this, never another peer's.
const MAX_ACCEPTED_PER_PEER: usize = 64;
/// Queue pairs accepted in all kept at most: a new peer beyond this is refused (busy).
const MAX_ACCEPTED: usize = 4096;

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
    /// A READ's landing in the local buffer while its work request is posted.
    landing: Option<Landing>,
}

impl SliceJob {
    /// Moves to the next path; false when every path was tried.
    fn next_path(&mut self) -> bool {
        self.attempts += 1;
        self.path = (self.path + 1) % self.paths.len();
        self.landing = None;
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
    devices: Vec<Arc<Device>>,
    conns: Mutex<HashMap<ConnKey, Arc<Qp>>>,
    connecting: tokio::sync::Mutex<()>,
    accepted: Mutex<Accepted>,
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

/// Queue pairs accepted from peers, by the peer's authenticated name.
#[derive(Default)]
struct Accepted {
    by_peer: HashMap<String, VecDeque<Arc<Qp>>>,
    total: usize,
}

impl Accepted {
    /// Keeps `q` for `peer`: evicts the peer's oldest beyond [`MAX_ACCEPTED_PER_PEER`];
    /// refuses a peer with nothing kept yet once [`MAX_ACCEPTED`] are kept.
    fn insert(&mut self, peer: &str, q: Arc<Qp>) -> std::result::Result<(), (Status, String)> {
        if !self.by_peer.contains_key(peer) && self.total >= MAX_ACCEPTED {
            return Err((
                Status::Busy,
                format!("{MAX_ACCEPTED} RDMA queue pairs already accepted; try later"),
            ));
        }
        let list = self.by_peer.entry(peer.to_owned()).or_default();
        list.push_back(q);
        self.total += 1;
        while list.len() > MAX_ACCEPTED_PER_PEER {
            list.pop_front();
            self.total -= 1;
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.by_peer.clear();
        self.total = 0;
    }
}

/// A completion-queue pointer handed to a poller thread.
struct CqPtr(*mut ffi::ibv_cq, #[allow(dead_code)] Arc<Device>);
// SAFETY: polling a CQ from one dedicated thread is allowed; the device (and so the CQ) is
// kept open by the Arc this value holds until the thread ends.
unsafe impl Send for CqPtr {}

impl Transport {
    /// Opens `devices` and starts one completion poller per device.
    pub(crate) fn open(devices: &[String], config: &EngineConfig) -> Result<Arc<Self>> {
        let opened = devices
            .iter()
            .map(|d| open_device(d, config.rdma_gid_index).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let (retry_tx, retry_rx) = mpsc::unbounded_channel();
        let t = Arc::new(Self {
            devices: opened,
            conns: Mutex::new(HashMap::new()),
            connecting: tokio::sync::Mutex::new(()),
            accepted: Mutex::new(Accepted::default()),
            pending: Arc::new(Pending::default()),
            retry_tx,
            running: Arc::new(AtomicBool::new(true)),
            pollers: Mutex::new(Vec::new()),
            slice_size: config.rdma_slice_size as u64,
            control_timeout: config.connect_timeout,
        });
        for dev in &t.devices {
            let (cq, pending, running, retry) = (
                CqPtr(dev.cq, dev.clone()),
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

    /// Registers `region` with every device: remote keys for the descriptor, local handles
    /// (the driver pins the pages: off the async threads).
    pub(crate) fn register(
        &self,
        region: &MemoryRegion,
    ) -> Result<(Vec<RdmaKey>, Vec<NicRegistration>)> {
        let mut keys = Vec::new();
        let mut mrs = Vec::new();
        let device = region.is_device();
        if device && !super::gpudirect_available() {
            tracing::info!(
                location = %region.location(),
                "no GPUDirect RDMA (no nvidia_peermem module): this device memory is staged over TCP"
            );
            return Ok((keys, mrs));
        }
        for (i, dev) in self.devices.iter().enumerate() {
            // SAFETY: the region is valid for its length while the MR lives (the MR is held by
            // the registration entry, which drops it before the region).
            let mr = run_blocking(|| unsafe {
                ffi::ibv_reg_mr(
                    dev.pd,
                    region.as_ptr().cast(),
                    region.len(),
                    access_flags() as i32,
                )
            });
            if mr.is_null() {
                let e = std::io::Error::last_os_error();
                if device {
                    // GPUDirect may still fail for this allocation (or this NIC): stage it.
                    tracing::warn!(error = %e, location = %region.location(), "ibv_reg_mr of device memory failed: this region is staged over TCP");
                    return Ok((Vec::new(), Vec::new()));
                }
                return Err(verbs_err("ibv_reg_mr", e));
            }
            // SAFETY: mr is non-null and live.
            let mr_ref = unsafe { &*mr };
            let (lkey, rkey) = (mr_ref.lkey, mr_ref.rkey);
            mrs.push(NicRegistration::new(
                i,
                lkey,
                MrHandle {
                    mr,
                    _dev: dev.clone(),
                },
            ));
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
                landing: None,
            };
            self.post(job).await;
        }
    }

    async fn connection(
        &self,
        peer_engine: u64,
        path: &RdmaPath,
        control: &Arc<Peer>,
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
        let q = run_blocking(|| create_qp(dev, path.local))?;
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
        run_blocking(|| connect_qp(&q, dev, &answer.endpoint))?;
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
            if job.op == Op::Read {
                // The NIC writes the local buffer until the work request completes; a timeout
                // or cancel meanwhile flushes the queue pair.
                match job.completion.begin_landing(Some(qp.abort.clone())) {
                    Some(l) => job.landing = Some(l),
                    None => return,
                }
            }
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
                    job.landing = None;
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
                        job.landing = None;
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

/// Target side of the handshake: a queue pair per initiator queue pair. The TCP server runs
/// it on a blocking thread (it creates and connects a queue pair: driver calls).
struct Acceptor(Arc<Transport>);

impl RdmaAcceptor for Acceptor {
    fn accept(
        &self,
        identity: &PeerIdentity,
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
        // (Runs on a blocking thread: the TCP server hands handshakes to spawn_blocking.)
        connect_qp(&q, dev, &hello.endpoint).map_err(|e| (Status::Unsupported, e.to_string()))?;
        let reply = RdmaHandshake {
            version: HANDSHAKE_VERSION,
            target_device: hello.endpoint.device.clone(),
            endpoint: t.endpoint_of(&q),
        };
        tracing::debug!(%peer, name = %identity.name, device = %dev.name, qp = q.num, "accepted RDMA queue pair");
        t.accepted.lock().insert(&identity.name, q)?;
        Ok(reply.encode())
    }
}
