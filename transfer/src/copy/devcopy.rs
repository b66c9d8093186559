//! Memory-copy requests with device memory on either side: into or out of the engine's own
//! device regions, a same-host peer's shared memory with a local device buffer, and a
//! same-host peer's device region opened through CUDA IPC.
//!
//! Every copy of a batch is enqueued on a copy stream of its device (one asynchronous copy
//! per request, the whole length: the device's copy engine needs no slicing), at submission
//! when both sides are device memory, else on a blocking thread right after; then one task
//! waits for their fences in turn and completes each request.
//! A request's landing lasts until its fence: a copy engine cannot be stopped, so a request
//! that times out or is cancelled is reported only once its copy is over, and nothing lands
//! in a buffer its caller took back. A fence that never comes (a hung device) is given up
//! on [`FENCE_GRACE`] after the request's deadline, with a warning.
//!
//! The peer checks are those of the host paths: a shared-memory peer's owner and control
//! page before and after, an IPC region's control block before and after.
//!
//! A host side in pageable memory is copied by the driver on the calling thread, through
//! its own pinned buffers, before the call returns: such a copy holds the CPU lock of those
//! bytes (as the engine's own copies do) during the call, and the copies of a batch with a
//! host side are started on a blocking thread, not on the runtime's. A host side in
//! page-locked memory (a pinned tensor) is read or written by the device's DMA after the
//! call, as a NIC does registered memory: outside the CPU lock, and outside any Rust
//! thread's view, like RDMA.

use std::sync::Arc;

use super::{CopyJob, CopyTarget};
use crate::device::{DeviceCtx, Devices, FENCE_GRACE, Fence};
use crate::error::{Result, TransferError};
use crate::home::Home;
use crate::memory::{Access, lock_all};
use crate::op::{BatchState, Landing, Op};

/// Starts the device copies of `jobs` and completes their requests as they finish.
/// Their waits run on the engine's `home` runtime (they outlive the submitting call).
pub(crate) fn run(devices: &Devices, home: &Home, batch: &Arc<BatchState>, jobs: Vec<CopyJob>) {
    if jobs.is_empty() {
        return;
    }
    let ctx = match devices.ctx() {
        Ok(c) => c.clone(),
        Err(e) => {
            for j in jobs {
                batch.finish(j.idx, Err(e.clone()));
            }
            return;
        }
    };
    let batch = batch.clone();
    if jobs.iter().any(|j| has_host_side(&batch, j)) {
        home.spawn(async move {
            let b = batch.clone();
            match tokio::task::spawn_blocking(move || start_all(&ctx, &b, jobs)).await {
                Ok(started) => wait(batch, started).await,
                // The thread panicked: requests it did not start time out at the deadline.
                Err(e) => tracing::error!(error = %e, "starting device copies failed"),
            }
        });
    } else {
        let started = start_all(&ctx, &batch, jobs);
        if !started.is_empty() {
            home.spawn(wait(batch, started));
        }
    }
}

/// A request whose local or remote side is host memory.
fn has_host_side(batch: &BatchState, job: &CopyJob) -> bool {
    batch.requests[job.idx].local.region().device().is_none()
        || match &job.target {
            CopyTarget::Peer(_) => true,
            CopyTarget::Local(e) => e.region.device().is_none(),
            CopyTarget::Ipc(_) => false,
        }
}

/// Enqueues the copies of `jobs`; those that could not start are finished.
fn start_all(
    ctx: &DeviceCtx,
    batch: &Arc<BatchState>,
    jobs: Vec<CopyJob>,
) -> Vec<(CopyJob, Landing, Fence)> {
    let mut started = Vec::with_capacity(jobs.len());
    for job in jobs {
        match start(ctx, batch, &job) {
            Ok(Some((landing, fence))) => started.push((job, landing, fence)),
            Ok(None) => {} // decided already (cancelled or expired)
            Err(e) => {
                batch.finish(job.idx, Err(e));
            }
        }
    }
    started
}

/// Waits for the fences of `started` in turn and completes their requests.
async fn wait(batch: Arc<BatchState>, started: Vec<(CopyJob, Landing, Fence)>) {
    let until = batch.deadline + FENCE_GRACE;
    for (job, landing, fence) in started {
        let r = match tokio::time::timeout_at(until, fence).await {
            Ok(r) => r.and_then(|()| recheck(&batch, &job)),
            Err(_) => {
                tracing::warn!(
                    "a device copy did not complete {FENCE_GRACE:?} after its deadline; giving up on it"
                );
                Err(TransferError::Device {
                    reason: "the device copy never completed".into(),
                })
            }
        };
        batch.finish(job.idx, r);
        drop(landing);
    }
}

/// Checks the remote side and enqueues the copy of one request; `None` if the request was
/// decided before its copy could start.
fn start(
    ctx: &DeviceCtx,
    batch: &Arc<BatchState>,
    job: &CopyJob,
) -> Result<Option<(Landing, Fence)>> {
    let req = &batch.requests[job.idx];
    let seg = req.segment.name();
    let range = req.remote_range();
    let (remote, remote_dev) = match &job.target {
        CopyTarget::Peer(m) => {
            m.check(seg, range)?;
            m.check_owner(seg)?;
            m.prefault(req.remote_addr, req.len, req.op == Op::Write);
            (m.ptr_of(req.remote_addr).0 as u64, None)
        }
        CopyTarget::Local(e) => (req.remote_addr, e.region.device().map(|a| a.pointer.device)),
        CopyTarget::Ipc(m) => {
            m.check(seg, range)?;
            (m.addr_of(req.remote_addr), Some(m.device))
        }
    };
    let local = req.local_ptr() as u64;
    let local_dev = req.local.region().device().map(|a| a.pointer.device);
    let device = local_dev
        .or(remote_dev)
        .ok_or_else(|| TransferError::invalid("a host copy reached the device copy path"))?;
    let len = req.len as u64;
    if matches!(job.target, CopyTarget::Local(_)) && local < remote + len && remote < local + len {
        return Err(TransferError::invalid(format!(
            "device copy between overlapping ranges [{local:#x}, +{len}) and [{remote:#x}, +{len})"
        )));
    }
    let (dst, src) = match req.op {
        Op::Write => (remote, local),
        Op::Read => (local, remote),
    };
    let Some(landing) = batch.begin_landing(job.idx, None) else {
        return Ok(None);
    };
    let stream = ctx.stream(device)?;
    // The host side's CPU lock, held while the driver may copy pageable memory on this
    // thread: shared where the copy reads, exclusive where it writes.
    let (local_access, remote_access) = match req.op {
        Op::Write => (Access::Read, Access::Write),
        Op::Read => (Access::Write, Access::Read),
    };
    let host = if local_dev.is_none() {
        Some((&**req.local.region().cpu(), req.local_offset, local_access))
    } else {
        match &job.target {
            CopyTarget::Peer(m) => m
                .owner_lock
                .as_deref()
                .map(|l| (l, (req.remote_addr - m.region.addr) as usize, remote_access)),
            CopyTarget::Local(e) if e.region.device().is_none() => Some((
                &**e.region.cpu(),
                (req.remote_addr - e.region.addr()) as usize,
                remote_access,
            )),
            _ => None,
        }
    };
    let held = host.map(|(lock, off, access)| lock_all(&[(lock, off, req.len, access)]));
    // SAFETY: the local range was checked at submit and is held by the batch; the remote
    // one lies in a region checked above (the peer's control page, the IPC control block or
    // this engine's registration table) that the job keeps open or registered until the
    // fence below resolved, and the two do not overlap (different memory, or checked). A
    // host side is locked against this process's other copies while the driver may read or
    // write it on this thread (pageable memory); past the call only the device's DMA may
    // (page-locked memory), which is not a Rust access.
    unsafe { stream.copy(dst, src, req.len)? };
    drop(held);
    match stream.fence() {
        Ok(fence) => Ok(Some((landing, fence))),
        Err(e) => {
            // The copy runs without a fence to wait on: the request ends (and its landing
            // with it) only once the stream drained.
            if let Err(s) = stream.synchronize() {
                tracing::warn!(error = %s, "a device stream without a fence could not be drained");
            }
            drop(landing);
            Err(e)
        }
    }
}

/// The remote side is still the registration the copy was for.
fn recheck(batch: &BatchState, job: &CopyJob) -> Result<()> {
    let req = &batch.requests[job.idx];
    match &job.target {
        CopyTarget::Peer(m) => m.check(req.segment.name(), req.remote_range()),
        CopyTarget::Ipc(m) => m.check(req.segment.name(), req.remote_range()),
        CopyTarget::Local(_) => Ok(()),
    }
}
