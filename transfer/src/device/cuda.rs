//! The CUDA driver API, loaded at run time from `libcuda.so.1` (the library every NVIDIA
//! driver installs), so this crate builds and runs without CUDA and only a process that
//! registers device memory needs a driver.
//!
//! Why a hand-written table of entry points over `libloading` rather than `cudarc`: the
//! engine needs about thirty driver calls and a clean error when the driver is missing;
//! `cudarc`'s dynamically loaded `sys` layer panics on first use without a driver and
//! generates bindings for the whole API. Every signature below is the driver's own (CUDA
//! 11 and later; `cuda.h`), named by its exported symbol.
//!
//! Driver calls run with the device's primary context pushed on the calling thread's
//! context stack and popped after (`Cuda::enter`): the caller's own current context (a
//! PyTorch thread's) is what it was before, and the engine uses the contexts the
//! application already made rather than creating one on a device it never touched (asking
//! where a pointer lives in a process with no context yet creates one only if the driver
//! will not answer without). Fences are stream callbacks
//! (`cuStreamAddCallback`): the driver calls back with the stream's status once the copies
//! before it completed, or failed, and the callback only wakes the waiting task, so no
//! thread blocks and nothing polls.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::marker::PhantomData;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::{Allocation, CopyStream, DeviceBackend, DevicePointer, Fence};
use crate::error::{Result, TransferError};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuDevicePtr = u64;
type StreamCallback = unsafe extern "C" fn(CuStream, CuResult, *mut c_void);

const CUDA_SUCCESS: CuResult = 0;
const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;
const CU_MEMORYTYPE_DEVICE: u64 = 2;
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;
const CU_STREAM_NON_BLOCKING: c_uint = 1;
const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// Bytes of a CUDA IPC memory handle.
pub const IPC_HANDLE_LEN: usize = 64;

#[repr(C)]
#[derive(Clone, Copy)]
struct IpcMemHandle {
    reserved: [c_char; IPC_HANDLE_LEN],
}

#[repr(C)]
struct CuUuid {
    bytes: [u8; 16],
}

/// The driver entry points the engine uses.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_uuid: unsafe extern "C" fn(*mut CuUuid, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_state: unsafe extern "C" fn(CuDevice, *mut c_uint, *mut c_int) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    ctx_push: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    ctx_get_device: unsafe extern "C" fn(*mut CuDevice) -> CuResult,
    pointer_attributes:
        unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, CuDevicePtr) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    mem_range: unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult,
    host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    host_free: unsafe extern "C" fn(*mut c_void) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_add_callback:
        unsafe extern "C" fn(CuStream, StreamCallback, *mut c_void, c_uint) -> CuResult,
    memcpy_async: unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult,
    ipc_get: unsafe extern "C" fn(*mut IpcMemHandle, CuDevicePtr) -> CuResult,
    ipc_open: unsafe extern "C" fn(*mut CuDevicePtr, IpcMemHandle, c_uint) -> CuResult,
    ipc_close: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Keeps the entry points above valid (never unloaded before them).
    _lib: libloading::Library,
}

impl Api {
    fn load(path: &str) -> std::result::Result<Self, String> {
        // SAFETY: loading the NVIDIA driver library runs its initialisers, which are made
        // to run in any process that links or loads CUDA; nothing else is assumed.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            format!(
                "it needs the CUDA driver, and {path} cannot be loaded ({e}): \
                 install the NVIDIA driver, or register host memory"
            )
        })?;
        macro_rules! sym {
            ($($name:literal)|+) => {{
                let mut found = None;
                $(
                    if found.is_none() {
                        // SAFETY: the symbol is the driver's entry point of that name, whose C
                        // signature (cuda.h) is the field's type; the pointer stays valid while
                        // `lib` is loaded, and `lib` lives in the same struct.
                        found = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                            .ok()
                            .map(|s: libloading::Symbol<'_, _>| *s);
                    }
                )+
                found.ok_or_else(|| {
                    format!("{path} lacks {}: the NVIDIA driver is too old (CUDA 11 or later is needed)",
                        [$($name),+].join(" / "))
                })?
            }};
        }
        Ok(Self {
            init: sym!("cuInit"),
            driver_version: sym!("cuDriverGetVersion"),
            device_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            device_uuid: sym!("cuDeviceGetUuid"),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
            primary_ctx_state: sym!("cuDevicePrimaryCtxGetState"),
            ctx_get_current: sym!("cuCtxGetCurrent"),
            ctx_push: sym!("cuCtxPushCurrent_v2"),
            ctx_pop: sym!("cuCtxPopCurrent_v2"),
            ctx_get_device: sym!("cuCtxGetDevice"),
            pointer_attributes: sym!("cuPointerGetAttributes"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_info: sym!("cuMemGetInfo_v2"),
            mem_free: sym!("cuMemFree_v2"),
            mem_range: sym!("cuMemGetAddressRange_v2"),
            host_alloc: sym!("cuMemHostAlloc"),
            host_free: sym!("cuMemFreeHost"),
            stream_create: sym!("cuStreamCreate"),
            stream_destroy: sym!("cuStreamDestroy_v2" | "cuStreamDestroy"),
            stream_synchronize: sym!("cuStreamSynchronize"),
            stream_add_callback: sym!("cuStreamAddCallback"),
            memcpy_async: sym!("cuMemcpyAsync"),
            ipc_get: sym!("cuIpcGetMemHandle"),
            ipc_open: sym!("cuIpcOpenMemHandle_v2" | "cuIpcOpenMemHandle"),
            ipc_close: sym!("cuIpcCloseMemHandle"),
            error_name: sym!("cuGetErrorName"),
            error_string: sym!("cuGetErrorString"),
            _lib: lib,
        })
    }
}

/// The CUDA driver, loaded and initialised: the production [`DeviceBackend`].
pub struct Cuda {
    /// This instance (every `Cuda` lives in an `Arc`; owners of driver objects hold it).
    me: std::sync::Weak<Cuda>,
    api: Api,
    library: String,
    version: i32,
    /// Primary context of each device used so far (retained for the process's life).
    contexts: Mutex<HashMap<u32, usize>>,
    /// A stream per device for blocking copies (`copy_blocking`), made on first use.
    sync_streams: Mutex<HashMap<u32, usize>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cuda({}, driver API {})", self.library, self.version)
    }
}

/// A context made current on this thread for a few driver calls; the thread's previous
/// context is current again when it drops. Not `Send`: a context stack is per thread, and
/// a guard is never held across an await.
struct Entered<'a> {
    cuda: &'a Cuda,
    pushed: bool,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CuContext = std::ptr::null_mut();
            // SAFETY: pops the context this guard pushed on this thread (guards nest).
            unsafe { (self.cuda.api.ctx_pop)(&mut popped) };
        }
    }
}

/// The library name the dynamic loader finds the driver under.
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";

static SHARED: OnceLock<std::result::Result<Arc<Cuda>, String>> = OnceLock::new();

impl Cuda {
    /// Loads and initialises the driver: the process-wide instance for the default library
    /// (`path` = `None`), or a separate one from `path`. The error says what is missing.
    pub fn load(path: Option<&Path>) -> std::result::Result<Arc<Cuda>, String> {
        match path {
            None => SHARED.get_or_init(|| Self::open(DEFAULT_LIBRARY)).clone(),
            Some(p) => Self::open(&p.to_string_lossy()),
        }
    }

    fn open(path: &str) -> std::result::Result<Arc<Cuda>, String> {
        let api = Api::load(path)?;
        let probe = Cuda {
            me: std::sync::Weak::new(),
            api,
            library: path.to_owned(),
            version: 0,
            contexts: Mutex::new(HashMap::new()),
            sync_streams: Mutex::new(HashMap::new()),
        };
        // SAFETY: cuInit takes a flags word that must be 0.
        let rc = unsafe { (probe.api.init)(0) };
        probe.check(rc, "cuInit").map_err(|e| {
            format!("the CUDA driver ({path}) did not initialise: {e}; no usable GPU")
        })?;
        let mut version = 0;
        // SAFETY: the out-pointer is a valid local.
        let rc = unsafe { (probe.api.driver_version)(&mut version) };
        probe
            .check(rc, "cuDriverGetVersion")
            .map_err(|e| e.to_string())?;
        tracing::info!(library = path, driver_api = version, "CUDA driver loaded");
        Ok(Arc::new_cyclic(|me| Cuda {
            me: me.clone(),
            version,
            ..probe
        }))
    }

    fn arc(&self) -> Arc<Cuda> {
        self.me.upgrade().expect("a Cuda instance lives in an Arc")
    }

    /// The driver API version (`cuDriverGetVersion`, e.g. 12040).
    pub fn driver_version(&self) -> i32 {
        self.version
    }

    fn error_text(&self, rc: CuResult) -> String {
        let mut name: *const c_char = std::ptr::null();
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the call writes a pointer to a static string (or leaves null) into the
        // valid out-pointer; it accepts any error code.
        unsafe { (self.api.error_name)(rc, &mut name) };
        // SAFETY: as above.
        unsafe { (self.api.error_string)(rc, &mut text) };
        let s = |p: *const c_char| {
            if p.is_null() {
                None
            } else {
                // SAFETY: non-null results point at the driver's static NUL-terminated strings.
                Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            }
        };
        match (s(name), s(text)) {
            (Some(n), Some(t)) => format!("{n}: {t}"),
            (Some(n), None) => n,
            _ => format!("CUDA error {rc}"),
        }
    }

    fn check(&self, rc: CuResult, what: &str) -> Result<()> {
        if rc == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(TransferError::Device {
                reason: format!("{what}: {}", self.error_text(rc)),
            })
        }
    }

    /// Free and total memory of `device`, in bytes (`cuMemGetInfo`): what leak checks
    /// compare.
    pub fn mem_info(&self, device: u32) -> Result<(u64, u64)> {
        let _ctx = self.enter(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the device's context is current.
        let rc = unsafe { (self.api.mem_info)(&mut free, &mut total) };
        self.check(rc, "cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    fn device(&self, device: u32) -> Result<CuDevice> {
        let ordinal = c_int::try_from(device).map_err(|_| TransferError::Device {
            reason: format!("no device cuda:{device}"),
        })?;
        let mut dev: CuDevice = 0;
        // SAFETY: valid out-pointer; the driver checks the ordinal.
        let rc = unsafe { (self.api.device_get)(&mut dev, ordinal) };
        self.check(rc, &format!("cuDeviceGet(cuda:{device})"))?;
        Ok(dev)
    }

    /// `device`'s primary context (retained on first use, for the process's life).
    fn primary(&self, device: u32) -> Result<CuContext> {
        let mut ctxs = self.contexts.lock();
        if let Some(c) = ctxs.get(&device) {
            return Ok(*c as CuContext);
        }
        let dev = self.device(device)?;
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: valid out-pointer and a device handle the driver gave.
        let rc = unsafe { (self.api.primary_ctx_retain)(&mut ctx, dev) };
        self.check(rc, "cuDevicePrimaryCtxRetain")?;
        ctxs.insert(device, ctx as usize);
        Ok(ctx)
    }

    /// The context current on this thread (null: none).
    fn current(&self) -> Result<CuContext> {
        let mut cur: CuContext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.api.ctx_get_current)(&mut cur) };
        self.check(rc, "cuCtxGetCurrent")?;
        Ok(cur)
    }

    /// Makes `device`'s primary context current on this thread until the guard drops
    /// (nothing to do when it already is).
    fn enter(&self, device: u32) -> Result<Entered<'_>> {
        let ctx = self.primary(device)?;
        let pushed = self.current()? != ctx;
        if pushed {
            // SAFETY: ctx is a primary context retained for the process's life.
            let rc = unsafe { (self.api.ctx_push)(ctx) };
            self.check(rc, "cuCtxPushCurrent")?;
        }
        Ok(Entered {
            cuda: self,
            pushed,
            _not_send: PhantomData,
        })
    }

    /// A context to make calls that need one but no device in particular: the thread's
    /// current one, else the first device whose primary context is already active (the
    /// application's). `None` when there is none: this process has not used a device.
    fn enter_any(&self) -> Result<Option<Entered<'_>>> {
        if !self.current()?.is_null() {
            return Ok(Some(Entered {
                cuda: self,
                pushed: false,
                _not_send: PhantomData,
            }));
        }
        match self.active_primary()? {
            Some(d) => self.enter(d).map(Some),
            None => Ok(None),
        }
    }

    /// The first device whose primary context is active (someone in this process made it).
    fn active_primary(&self) -> Result<Option<u32>> {
        for d in 0..self.device_count()? {
            let dev = self.device(d)?;
            let (mut flags, mut active): (c_uint, c_int) = (0, 0);
            // SAFETY: valid out-pointers and a device handle the driver gave.
            let rc = unsafe { (self.api.primary_ctx_state)(dev, &mut flags, &mut active) };
            self.check(rc, "cuDevicePrimaryCtxGetState")?;
            if active != 0 {
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// The ordinal of the device of this thread's current context.
    fn current_device(&self) -> Result<u32> {
        let mut dev: CuDevice = 0;
        // SAFETY: valid out-pointer; the caller made a context current.
        let rc = unsafe { (self.api.ctx_get_device)(&mut dev) };
        self.check(rc, "cuCtxGetDevice")?;
        for d in 0..self.device_count()? {
            if self.device(d)? == dev {
                return Ok(d);
            }
        }
        Err(TransferError::Device {
            reason: "the current CUDA context's device is not one this process sees".into(),
        })
    }

    /// What the driver says `addr` is, asked with whatever context is current.
    fn pointer_kind(&self, addr: u64) -> Result<Option<DevicePointer>> {
        let mut attrs = [
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            CU_POINTER_ATTRIBUTE_IS_MANAGED,
        ];
        // Each attribute is at most 8 bytes (an int, a bool, a pointer or a size): zeroed
        // 8-byte slots read back correctly whichever width the driver writes (little endian).
        let mut data = [0u64; 5];
        let mut ptrs: [*mut c_void; 5] =
            std::array::from_fn(|i| (&mut data[i] as *mut u64).cast::<c_void>());
        // SAFETY: five attribute codes and five valid 8-byte out-slots; the driver answers
        // defaults (memory type 0) for addresses it does not know.
        let rc = unsafe {
            (self.api.pointer_attributes)(5, attrs.as_mut_ptr(), ptrs.as_mut_ptr(), addr)
        };
        self.check(rc, "cuPointerGetAttributes")?;
        let managed = data[4] & 0xff != 0;
        if data[0] & 0xffff_ffff != CU_MEMORYTYPE_DEVICE || managed {
            return Ok(None);
        }
        Ok(Some(DevicePointer {
            device: (data[1] & 0xffff_ffff) as u32,
            base: data[2],
            size: data[3],
        }))
    }

    /// The stream of `device` that blocking copies use: a blocking stream (flags 0), so its
    /// copies wait for the application's work on the legacy default stream, as `cuMemcpy`
    /// would.
    fn sync_stream(&self, device: u32) -> Result<CuStream> {
        let mut streams = self.sync_streams.lock();
        if let Some(s) = streams.get(&device) {
            return Ok(*s as CuStream);
        }
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the caller made the device's context current.
        let rc = unsafe { (self.api.stream_create)(&mut raw, 0) };
        self.check(rc, "cuStreamCreate")?;
        streams.insert(device, raw as usize);
        Ok(raw)
    }
}

/// A CUDA stream and the driver it belongs to (destroyed with the last clone).
struct StreamInner {
    cuda: Arc<Cuda>,
    device: u32,
    raw: usize,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.cuda.enter(self.device) {
            // SAFETY: raw came from cuStreamCreate and is destroyed once, here.
            unsafe { (self.cuda.api.stream_destroy)(self.raw as CuStream) };
        }
    }
}

struct CudaStream(Arc<StreamInner>);

/// Wakes the task waiting on a fence with the stream's status: the driver calls this once
/// the copies enqueued before it completed, or the stream failed.
unsafe extern "C" fn fence_reached(_stream: CuStream, status: CuResult, user: *mut c_void) {
    // SAFETY: `user` is the boxed sender `fence` leaked for exactly this one call.
    let tx = unsafe { Box::from_raw(user.cast::<oneshot::Sender<CuResult>>()) };
    let _ = tx.send(status);
}

impl CopyStream for CudaStream {
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        let s = &self.0;
        let _ctx = s.cuda.enter(s.device)?;
        // SAFETY: the caller keeps both ranges valid until a later fence resolved; with
        // unified addressing the driver finds the kind of each side from the address.
        let rc = unsafe { (s.cuda.api.memcpy_async)(dst, src, len, s.raw as CuStream) };
        s.cuda.check(rc, "cuMemcpyAsync")
    }

    fn fence(&self) -> Result<Fence> {
        let s = self.0.clone();
        let (tx, rx) = oneshot::channel::<CuResult>();
        let rc = {
            let _ctx = s.cuda.enter(s.device)?;
            let user = Box::into_raw(Box::new(tx)).cast::<c_void>();
            // SAFETY: the stream is live (held by `s`); the driver calls the callback exactly
            // once (with an error status if the stream failed), which takes back `user`.
            let rc = unsafe {
                (s.cuda.api.stream_add_callback)(s.raw as CuStream, fence_reached, user, 0)
            };
            if rc != CUDA_SUCCESS {
                // SAFETY: the driver refused the call, so it will never call back: the box
                // is still ours.
                drop(unsafe { Box::from_raw(user.cast::<oneshot::Sender<CuResult>>()) });
            }
            rc
        };
        s.cuda.check(rc, "cuStreamAddCallback")?;
        Ok(Fence::new(async move {
            let status = rx.await.map_err(|_| TransferError::Device {
                reason: "the CUDA stream was torn down before its copies completed".into(),
            })?;
            // The stream (held by `s`) lives until here.
            s.cuda.check(status, "copy on CUDA stream")
        }))
    }

    fn synchronize(&self) -> Result<()> {
        let s = &self.0;
        let _ctx = s.cuda.enter(s.device)?;
        // SAFETY: the stream is live (held by `self`).
        let rc = unsafe { (s.cuda.api.stream_synchronize)(s.raw as CuStream) };
        s.cuda.check(rc, "cuStreamSynchronize")
    }
}

/// Frees device memory from `cuMemAlloc`.
struct DeviceOwner {
    cuda: Arc<Cuda>,
    device: u32,
    ptr: CuDevicePtr,
}

impl Drop for DeviceOwner {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.cuda.enter(self.device) {
            // SAFETY: ptr came from cuMemAlloc and is freed once, here.
            unsafe { (self.cuda.api.mem_free)(self.ptr) };
        }
    }
}

/// Frees pinned memory from `cuMemHostAlloc` (with the context of the device it was
/// allocated under).
struct PinnedOwner {
    cuda: Arc<Cuda>,
    device: u32,
    ptr: usize,
}

impl Drop for PinnedOwner {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.cuda.enter(self.device) {
            // SAFETY: ptr came from cuMemHostAlloc and is freed once, here.
            unsafe { (self.cuda.api.host_free)(self.ptr as *mut c_void) };
        }
    }
}

/// Closes an opened IPC handle.
struct IpcOwner {
    cuda: Arc<Cuda>,
    device: u32,
    ptr: CuDevicePtr,
}

impl Drop for IpcOwner {
    fn drop(&mut self) {
        if let Ok(_ctx) = self.cuda.enter(self.device) {
            // SAFETY: ptr came from cuIpcOpenMemHandle and is closed once, here.
            unsafe { (self.cuda.api.ipc_close)(self.ptr) };
        }
    }
}

impl DeviceBackend for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.api.device_count)(&mut n) };
        self.check(rc, "cuDeviceGetCount")?;
        Ok(n.max(0) as u32)
    }

    fn locate(&self, addr: u64) -> Result<Option<DevicePointer>> {
        // With unified addressing any context answers for every address of the process:
        // the thread's, or one the application made. With none, the driver is asked as it
        // is, and only if it wants a context is device 0's made for it.
        let entered = self.enter_any()?;
        match self.pointer_kind(addr) {
            Err(_) if entered.is_none() => {
                let _ctx = self.enter(0)?;
                self.pointer_kind(addr)
            }
            r => r,
        }
    }

    fn stream(&self, device: u32) -> Result<Arc<dyn CopyStream>> {
        let _ctx = self.enter(device)?;
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device's context is current.
        let rc = unsafe { (self.api.stream_create)(&mut raw, CU_STREAM_NON_BLOCKING) };
        self.check(rc, "cuStreamCreate")?;
        Ok(Arc::new(CudaStream(Arc::new(StreamInner {
            cuda: self.arc(),
            device,
            raw: raw as usize,
        }))))
    }

    unsafe fn copy_blocking(&self, device: u32, dst: u64, src: u64, len: usize) -> Result<()> {
        let _ctx = self.enter(device)?;
        let stream = self.sync_stream(device)?;
        // SAFETY: forwarded caller contract; the stream is the device's, alive for the
        // process. A copy from pageable memory may return before its bytes reach the device
        // (cuMemcpy would too): the stream is synchronized before the call returns.
        let rc = unsafe { (self.api.memcpy_async)(dst, src, len, stream) };
        self.check(rc, "cuMemcpyAsync")?;
        // SAFETY: as above; waits for the copy just enqueued (and only this stream's work).
        let rc = unsafe { (self.api.stream_synchronize)(stream) };
        self.check(rc, "cuStreamSynchronize")
    }

    fn alloc_pinned(&self, len: usize) -> Result<Allocation> {
        // Pinned memory lives as long as the context it was made under: a primary context
        // this engine retains, of the thread's current device, else of a device already in
        // use, else device 0's (portable memory serves every device).
        let device = if self.current()?.is_null() {
            self.active_primary()?.unwrap_or(0)
        } else {
            self.current_device()?
        };
        let _ctx = self.enter(device)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        let rc = unsafe { (self.api.host_alloc)(&mut p, len, CU_MEMHOSTALLOC_PORTABLE) };
        self.check(rc, &format!("cuMemHostAlloc({len})"))?;
        Ok(Allocation::new(
            p as u64,
            len,
            PinnedOwner {
                cuda: self.arc(),
                device,
                ptr: p as usize,
            },
        ))
    }

    fn alloc_device(&self, device: u32, len: usize) -> Result<Allocation> {
        let _ctx = self.enter(device)?;
        let mut p: CuDevicePtr = 0;
        // SAFETY: valid out-pointer; the device's context is current.
        let rc = unsafe { (self.api.mem_alloc)(&mut p, len) };
        self.check(rc, &format!("cuMemAlloc({len}) on cuda:{device}"))?;
        Ok(Allocation::new(
            p,
            len,
            DeviceOwner {
                cuda: self.arc(),
                device,
                ptr: p,
            },
        ))
    }

    fn ipc_export(&self, ptr: &DevicePointer) -> Result<Vec<u8>> {
        let _ctx = self.enter(ptr.device)?;
        let mut h = IpcMemHandle {
            reserved: [0; IPC_HANDLE_LEN],
        };
        // SAFETY: valid out-pointer; `base` is the start of a device allocation.
        let rc = unsafe { (self.api.ipc_get)(&mut h, ptr.base) };
        self.check(rc, "cuIpcGetMemHandle")?;
        Ok(h.reserved.iter().map(|b| *b as u8).collect())
    }

    fn ipc_open(&self, device: u32, handle: &[u8]) -> Result<Allocation> {
        let bytes: [u8; IPC_HANDLE_LEN] = handle.try_into().map_err(|_| TransferError::Device {
            reason: format!(
                "a CUDA IPC handle has {IPC_HANDLE_LEN} bytes, not {}",
                handle.len()
            ),
        })?;
        let _ctx = self.enter(device)?;
        let h = IpcMemHandle {
            reserved: bytes.map(|b| b as c_char),
        };
        let mut p: CuDevicePtr = 0;
        // SAFETY: valid out-pointer; the handle is passed by value as the driver expects.
        let rc = unsafe { (self.api.ipc_open)(&mut p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) };
        self.check(rc, "cuIpcOpenMemHandle")?;
        let owner = IpcOwner {
            cuda: self.arc(),
            device,
            ptr: p,
        };
        // The allocation's real size, which bounds what a peer's descriptor may claim.
        let (mut base, mut size): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: valid out-pointers; `p` is the start of the allocation just mapped.
        let rc = unsafe { (self.api.mem_range)(&mut base, &mut size, p) };
        self.check(rc, "cuMemGetAddressRange")?;
        Ok(Allocation::new(p, size, owner))
    }

    fn device_uuid(&self, device: u32) -> Result<String> {
        let dev = self.device(device)?;
        let mut u = CuUuid { bytes: [0; 16] };
        // SAFETY: valid out-pointer and device handle.
        let rc = unsafe { (self.api.device_uuid)(&mut u, dev) };
        self.check(rc, "cuDeviceGetUuid")?;
        Ok(format_uuid(&u.bytes))
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints it.
fn format_uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_a_clear_error() {
        let e = Cuda::load(Some(Path::new("/nonexistent/libcuda.so.1"))).unwrap_err();
        assert!(e.contains("/nonexistent/libcuda.so.1"), "{e}");
        assert!(e.contains("CUDA driver"), "{e}");
        assert!(e.contains("register host memory"), "{e}");
    }

    #[test]
    fn a_library_that_is_not_the_driver_is_refused() {
        // libc loads, but has none of the driver's entry points.
        let e = Cuda::load(Some(Path::new("libc.so.6"))).unwrap_err();
        assert!(e.contains("lacks cuInit"), "{e}");
    }

    #[test]
    fn uuids_print_as_nvidia_smi_does() {
        let b: [u8; 16] = std::array::from_fn(|i| i as u8 * 17);
        assert_eq!(format_uuid(&b), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }
}
