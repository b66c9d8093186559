//! The CUDA driver API, loaded at run time from `libcuda.so.1` (the library every NVIDIA
//! driver installs), so this crate builds and runs without CUDA and only a process that
//! registers device memory needs a driver.
//!
//! Why a hand-written table of entry points over `libloading` rather than `cudarc`: the
//! engine needs about twenty driver calls and a clean error when the driver is missing;
//! `cudarc`'s dynamically loaded `sys` layer panics on first use without a driver and
//! generates bindings for the whole API. Every signature below is the driver's own (CUDA
//! 11 and later; `cuda.h`), named by its exported symbol.
//!
//! Each thread making driver calls binds the device's primary context first (`bind`,
//! cached per thread). Fences are host functions enqueued on the stream
//! (`cuLaunchHostFunc`): the driver calls back when the copies before it completed, and
//! the callback only wakes the waiting task, so no thread blocks and nothing polls.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
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
type HostFn = unsafe extern "C" fn(*mut c_void);

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NOT_READY: CuResult = 600;
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
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    pointer_attributes:
        unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, CuDevicePtr) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    host_free: unsafe extern "C" fn(*mut c_void) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_query: unsafe extern "C" fn(CuStream) -> CuResult,
    launch_host_func: unsafe extern "C" fn(CuStream, HostFn, *mut c_void) -> CuResult,
    memcpy: unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize) -> CuResult,
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
            ctx_set_current: sym!("cuCtxSetCurrent"),
            pointer_attributes: sym!("cuPointerGetAttributes"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_info: sym!("cuMemGetInfo_v2"),
            mem_free: sym!("cuMemFree_v2"),
            host_alloc: sym!("cuMemHostAlloc"),
            host_free: sym!("cuMemFreeHost"),
            stream_create: sym!("cuStreamCreate"),
            stream_destroy: sym!("cuStreamDestroy_v2" | "cuStreamDestroy"),
            stream_query: sym!("cuStreamQuery"),
            launch_host_func: sym!("cuLaunchHostFunc"),
            memcpy: sym!("cuMemcpy"),
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
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cuda({}, driver API {})", self.library, self.version)
    }
}

thread_local! {
    /// The context this thread made current last (0: none yet).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
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
        self.bind(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the device's context is current.
        let rc = unsafe { (self.api.mem_info)(&mut free, &mut total) };
        self.check(rc, "cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    /// Makes `device`'s primary context current on this thread.
    fn bind(&self, device: u32) -> Result<()> {
        let ctx = {
            let mut ctxs = self.contexts.lock();
            match ctxs.get(&device) {
                Some(c) => *c,
                None => {
                    let mut dev: CuDevice = 0;
                    let ordinal = c_int::try_from(device).map_err(|_| TransferError::Device {
                        reason: format!("no device cuda:{device}"),
                    })?;
                    // SAFETY: valid out-pointer; the driver checks the ordinal.
                    let rc = unsafe { (self.api.device_get)(&mut dev, ordinal) };
                    self.check(rc, &format!("cuDeviceGet(cuda:{device})"))?;
                    let mut ctx: CuContext = std::ptr::null_mut();
                    // SAFETY: valid out-pointer and a device handle the driver gave.
                    let rc = unsafe { (self.api.primary_ctx_retain)(&mut ctx, dev) };
                    self.check(rc, "cuDevicePrimaryCtxRetain")?;
                    ctxs.insert(device, ctx as usize);
                    ctx as usize
                }
            }
        };
        if CURRENT.with(Cell::get) != ctx {
            // SAFETY: ctx is a primary context retained above (never released).
            let rc = unsafe { (self.api.ctx_set_current)(ctx as CuContext) };
            self.check(rc, "cuCtxSetCurrent")?;
            CURRENT.with(|c| c.set(ctx));
        }
        Ok(())
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
        if self.cuda.bind(self.device).is_ok() {
            // SAFETY: raw came from cuStreamCreate and is destroyed once, here.
            unsafe { (self.cuda.api.stream_destroy)(self.raw as CuStream) };
        }
    }
}

struct CudaStream(Arc<StreamInner>);

/// Wakes the task waiting on a fence: the driver calls this once the copies enqueued before
/// it completed.
unsafe extern "C" fn fence_reached(user: *mut c_void) {
    // SAFETY: `user` is the boxed sender `fence` leaked for exactly this one call.
    let tx = unsafe { Box::from_raw(user.cast::<oneshot::Sender<()>>()) };
    let _ = tx.send(());
}

impl CopyStream for CudaStream {
    unsafe fn copy(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        let s = &self.0;
        s.cuda.bind(s.device)?;
        // SAFETY: the caller keeps both ranges valid until a later fence resolved; with
        // unified addressing the driver finds the kind of each side from the address.
        let rc = unsafe { (s.cuda.api.memcpy_async)(dst, src, len, s.raw as CuStream) };
        s.cuda.check(rc, "cuMemcpyAsync")
    }

    fn fence(&self) -> Result<Fence> {
        let s = self.0.clone();
        s.cuda.bind(s.device)?;
        let (tx, rx) = oneshot::channel::<()>();
        let user = Box::into_raw(Box::new(tx)).cast::<c_void>();
        // SAFETY: the stream is live (held by `s`); the callback takes back `user` exactly
        // once when the driver calls it.
        let rc = unsafe { (s.cuda.api.launch_host_func)(s.raw as CuStream, fence_reached, user) };
        if rc != CUDA_SUCCESS {
            // SAFETY: the driver refused the call, so it will never call back: the box is
            // still ours.
            drop(unsafe { Box::from_raw(user.cast::<oneshot::Sender<()>>()) });
            s.cuda.check(rc, "cuLaunchHostFunc")?;
        }
        Ok(Fence::new(async move {
            rx.await.map_err(|_| TransferError::Device {
                reason: "the CUDA stream was torn down before its copies completed".into(),
            })?;
            // A copy that failed leaves its error on the stream.
            s.cuda.bind(s.device)?;
            // SAFETY: the stream is live (held by `s`).
            let rc = unsafe { (s.cuda.api.stream_query)(s.raw as CuStream) };
            if rc == CUDA_ERROR_NOT_READY {
                return Ok(());
            }
            s.cuda.check(rc, "copy on CUDA stream")
        }))
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
        if self.cuda.bind(self.device).is_ok() {
            // SAFETY: ptr came from cuMemAlloc and is freed once, here.
            unsafe { (self.cuda.api.mem_free)(self.ptr) };
        }
    }
}

/// Frees pinned memory from `cuMemHostAlloc`.
struct PinnedOwner {
    cuda: Arc<Cuda>,
    ptr: usize,
}

impl Drop for PinnedOwner {
    fn drop(&mut self) {
        if self.cuda.bind(0).is_ok() {
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
        if self.cuda.bind(self.device).is_ok() {
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
        if self.device_count()? > 0 {
            self.bind(0)?;
        }
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

    fn stream(&self, device: u32) -> Result<Arc<dyn CopyStream>> {
        self.bind(device)?;
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
        self.bind(device)?;
        // SAFETY: forwarded caller contract; cuMemcpy returns once the bytes are in place.
        let rc = unsafe { (self.api.memcpy)(dst, src, len) };
        self.check(rc, "cuMemcpy")
    }

    fn alloc_pinned(&self, len: usize) -> Result<Allocation> {
        self.bind(0)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; a context is current.
        let rc = unsafe { (self.api.host_alloc)(&mut p, len, CU_MEMHOSTALLOC_PORTABLE) };
        self.check(rc, &format!("cuMemHostAlloc({len})"))?;
        Ok(Allocation::new(
            p as u64,
            len,
            PinnedOwner {
                cuda: self.arc(),
                ptr: p as usize,
            },
        ))
    }

    fn alloc_device(&self, device: u32, len: usize) -> Result<Allocation> {
        self.bind(device)?;
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
        self.bind(ptr.device)?;
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
        self.bind(device)?;
        let h = IpcMemHandle {
            reserved: bytes.map(|b| b as c_char),
        };
        let mut p: CuDevicePtr = 0;
        // SAFETY: valid out-pointer; the handle is passed by value as the driver expects.
        let rc = unsafe { (self.api.ipc_open)(&mut p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) };
        self.check(rc, "cuIpcOpenMemHandle")?;
        Ok(Allocation::new(
            p,
            0,
            IpcOwner {
                cuda: self.arc(),
                device,
                ptr: p,
            },
        ))
    }

    fn device_uuid(&self, device: u32) -> Result<String> {
        let mut dev: CuDevice = 0;
        let ordinal = c_int::try_from(device).map_err(|_| TransferError::Device {
            reason: format!("no device cuda:{device}"),
        })?;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.api.device_get)(&mut dev, ordinal) };
        self.check(rc, &format!("cuDeviceGet(cuda:{device})"))?;
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
