//! The HDF5 C library (1.10 or newer), loaded at run time: dpw builds without it, and only a
//! run that reads deepmd/hdf5 data needs it installed. The library is not thread-safe as
//! distributions build it, so every call is made under one process-wide lock ([`lock`]).
//! Where there are no shared libraries (the browser's wasm) there is no HDF5 either.
#![cfg_attr(not(any(unix, windows)), allow(dead_code))]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};

#[cfg(any(unix, windows))]
use libloading::Library;

pub type Hid = i64;
type Herr = c_int;
type Htri = c_int;

// Constants of H5public.h, H5Fpublic.h, H5Ppublic.h, H5Spublic.h and H5Tpublic.h (stable
// since 1.10, when hid_t became 64 bits).
pub const P_DEFAULT: Hid = 0;
pub const S_ALL: Hid = 0;
const E_DEFAULT: Hid = 0;
const F_ACC_RDONLY: c_uint = 0;
const F_ACC_RDWR: c_uint = 1;
const F_ACC_TRUNC: c_uint = 2;
pub const T_INTEGER: c_int = 0;
pub const T_FLOAT: c_int = 1;
pub const T_STRING: c_int = 3;
pub const T_SGN_NONE: c_int = 0;
const T_VARIABLE: usize = usize::MAX;
const S_SCALAR: c_int = 0;
const INDEX_NAME: c_int = 0;
const ITER_INC: c_int = 0;

/// `H5G_info_t`, with room to spare after its last field (`hbool_t` is 1 or 4 bytes).
#[repr(C)]
struct GroupInfo {
    storage_type: c_int,
    nlinks: u64,
    max_corder: i64,
    mounted: [u8; 8],
}

/// Declares the library's functions once: the table's fields and where they are looked up.
macro_rules! api {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        #[allow(non_snake_case)]
        struct Fns {
            $($name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }
        #[cfg(any(unix, windows))]
        impl Fns {
            /// # Safety
            /// `lib` must be an HDF5 library, whose symbols have these C signatures.
            /// A failure names the first symbol missing (another library was named).
            unsafe fn load(lib: &Library) -> Result<Fns, String> {
                let missing = |name: &str, e: libloading::Error| {
                    format!("not an HDF5 library: it has no symbol {name} ({e})")
                };
                Ok(Fns {
                    $($name: *unsafe { lib.get(concat!(stringify!($name), "\0").as_bytes()) }
                        .map_err(|e| missing(stringify!($name), e))?,)*
                })
            }
        }
    };
}

api! {
    H5open: fn() -> Herr;
    H5get_libversion: fn(*mut c_uint, *mut c_uint, *mut c_uint) -> Herr;
    H5Eset_auto2: fn(Hid, *const c_void, *mut c_void) -> Herr;
    H5free_memory: fn(*mut c_void) -> Herr;
    H5Fopen: fn(*const c_char, c_uint, Hid) -> Hid;
    H5Fcreate: fn(*const c_char, c_uint, Hid, Hid) -> Hid;
    H5Fclose: fn(Hid) -> Herr;
    H5Gopen2: fn(Hid, *const c_char, Hid) -> Hid;
    H5Gcreate2: fn(Hid, *const c_char, Hid, Hid, Hid) -> Hid;
    H5Gget_info: fn(Hid, *mut GroupInfo) -> Herr;
    H5Gclose: fn(Hid) -> Herr;
    H5Lexists: fn(Hid, *const c_char, Hid) -> Htri;
    H5Ldelete: fn(Hid, *const c_char, Hid) -> Herr;
    H5Lget_name_by_idx: fn(Hid, *const c_char, c_int, c_int, u64, *mut c_char, usize, Hid) -> isize;
    H5Dopen2: fn(Hid, *const c_char, Hid) -> Hid;
    H5Dcreate2: fn(Hid, *const c_char, Hid, Hid, Hid, Hid, Hid) -> Hid;
    H5Dget_type: fn(Hid) -> Hid;
    H5Dget_space: fn(Hid) -> Hid;
    H5Dread: fn(Hid, Hid, Hid, Hid, Hid, *mut c_void) -> Herr;
    H5Dwrite: fn(Hid, Hid, Hid, Hid, Hid, *const c_void) -> Herr;
    H5Dclose: fn(Hid) -> Herr;
    H5Screate: fn(c_int) -> Hid;
    H5Screate_simple: fn(c_int, *const u64, *const u64) -> Hid;
    H5Sget_simple_extent_ndims: fn(Hid) -> c_int;
    H5Sget_simple_extent_dims: fn(Hid, *mut u64, *mut u64) -> c_int;
    H5Sclose: fn(Hid) -> Herr;
    H5Tcopy: fn(Hid) -> Hid;
    H5Tget_class: fn(Hid) -> c_int;
    H5Tget_size: fn(Hid) -> usize;
    H5Tset_size: fn(Hid, usize) -> Herr;
    H5Tget_sign: fn(Hid) -> c_int;
    H5Tget_cset: fn(Hid) -> c_int;
    H5Tset_cset: fn(Hid, c_int) -> Herr;
    H5Tis_variable_str: fn(Hid) -> Htri;
    H5Tclose: fn(Hid) -> Herr;
}

/// The library's predefined types: global variables set by `H5open`.
#[derive(Clone, Copy)]
pub struct Types {
    pub f32: Hid,
    pub f64: Hid,
    pub i8: Hid,
    pub i32: Hid,
    pub i64: Hid,
    pub u64: Hid,
    pub c_s1: Hid,
}

pub struct Api {
    fns: Fns,
    pub t: Types,
    #[cfg(any(unix, windows))]
    _lib: Library,
}

/// Names the library goes by: the development symlink, then the run-time names of Debian and
/// Ubuntu (serial build), of 1.14 / 1.12 / 1.10 builds elsewhere (Fedora, conda), and macOS.
const NAMES: &[&str] = &[
    "libhdf5.so",
    "libhdf5_serial.so.103",
    "libhdf5.so.310",
    "libhdf5.so.200",
    "libhdf5.so.103",
    "libhdf5_serial.so",
    "libhdf5.dylib",
    "libhdf5.310.dylib",
    "hdf5.dll",
];

/// The environment variable naming the library file, tried instead of [`NAMES`].
const LIB_VAR: &str = "DPW_HDF5_LIB";

#[cfg(not(any(unix, windows)))]
fn load() -> Result<Api, String> {
    Err("this build cannot load the HDF5 library (no shared libraries here)".into())
}

#[cfg(any(unix, windows))]
fn load() -> Result<Api, String> {
    let env = std::env::var(LIB_VAR).ok().filter(|v| !v.is_empty());
    let names: Vec<&str> = match &env {
        Some(path) => vec![path],
        None => NAMES.to_vec(),
    };
    let mut last = String::new();
    for name in &names {
        // SAFETY: loading runs the library's initialisers; HDF5's only set up its globals.
        match unsafe { Library::new(*name) } {
            Ok(lib) => return init(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!(
        "reading deepmd/hdf5 data needs the HDF5 C library, 1.10 or newer (Debian/Ubuntu: \
         apt-get install libhdf5-103-1 or libhdf5-dev; or name the file in {LIB_VAR}); {} \
         could not be loaded ({last})",
        match &env {
            Some(path) => format!("{LIB_VAR}={path}"),
            None => format!("none of {}", NAMES.join(", ")),
        }
    ))
}

#[cfg(any(unix, windows))]
fn init(lib: Library) -> Result<Api, String> {
    // SAFETY: the names are HDF5's functions with the C signatures of its headers.
    let fns = unsafe { Fns::load(&lib) }?;
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: plain calls with valid out-pointers; H5open sets up the predefined types.
    unsafe {
        if (fns.H5open)() < 0 {
            return Err("H5open failed".into());
        }
        (fns.H5get_libversion)(&mut major, &mut minor, &mut release);
        // dpw reports its own errors; the library's would print a stack per failed lookup.
        (fns.H5Eset_auto2)(E_DEFAULT, std::ptr::null(), std::ptr::null_mut());
    }
    if (major, minor) < (1, 10) {
        return Err(format!(
            "HDF5 {major}.{minor}.{release}; dpw needs 1.10 or newer"
        ));
    }
    let global = |name: &str| -> Result<Hid, String> {
        let sym = format!("{name}_g\0");
        // SAFETY: H5T_* globals are hid_t variables, set by H5open above.
        unsafe {
            lib.get::<*const Hid>(sym.as_bytes())
                .map(|p| **p)
                .map_err(|e| e.to_string())
        }
    };
    let t = Types {
        f32: global("H5T_NATIVE_FLOAT")?,
        f64: global("H5T_NATIVE_DOUBLE")?,
        i8: global("H5T_NATIVE_SCHAR")?,
        i32: global("H5T_NATIVE_INT")?,
        i64: global("H5T_NATIVE_LLONG")?,
        u64: global("H5T_NATIVE_ULLONG")?,
        c_s1: global("H5T_C_S1")?,
    };
    Ok(Api { fns, t, _lib: lib })
}

/// The library, held under the process-wide lock for as long as the guard lives.
pub struct H5 {
    api: &'static Api,
    _lock: MutexGuard<'static, ()>,
}

/// Loads the library on first use (an error says how to install it) and takes its lock. A
/// thread must not take it twice: handles that outlive a guard ([`Owned`]) lock on drop.
pub fn lock() -> Result<H5, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    static LOCK: Mutex<()> = Mutex::new(());
    let api = API.get_or_init(load).as_ref().map_err(Clone::clone)?;
    Ok(H5 {
        api,
        _lock: LOCK.lock().unwrap_or_else(|e| e.into_inner()),
    })
}

fn c_name(s: &str) -> CString {
    // An interior NUL cannot name an HDF5 object; "\u{fffd}" names none either.
    CString::new(s).unwrap_or_else(|_| c"\u{fffd}".into())
}

fn c_path(p: &Path) -> CString {
    c_name(&p.to_string_lossy())
}

/// What a handle is, for closing it.
#[derive(Clone, Copy)]
pub enum Kind {
    File,
    Group,
    Dataset,
    Space,
    Type,
}

/// A handle closed when the guard it was opened under is still held (`'g`).
pub struct Scoped<'g> {
    h5: &'g H5,
    pub id: Hid,
    kind: Kind,
}

impl Drop for Scoped<'_> {
    fn drop(&mut self) {
        self.h5.close(self.id, self.kind);
    }
}

/// A handle that outlives the guard it was opened under: its drop takes the lock again, so
/// it must be dropped where the thread holds none.
pub struct Owned {
    pub id: Hid,
    kind: Kind,
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Ok(h5) = lock() {
            h5.close(self.id, self.kind);
        }
    }
}

impl<'g> Scoped<'g> {
    /// The handle, kept open past the guard.
    pub fn keep(self) -> Owned {
        let me = std::mem::ManuallyDrop::new(self);
        Owned {
            id: me.id,
            kind: me.kind,
        }
    }
}

/// A dataset's element type, as far as dpw reads datasets.
pub enum Element {
    Float {
        bytes: usize,
    },
    Integer {
        signed: bool,
    },
    /// Strings, of fixed or variable length.
    String,
    Other(c_int),
}

impl Element {
    /// The element type in words, for errors.
    pub fn name(&self) -> String {
        match self {
            Element::Float { bytes } => format!("{}-bit floats", 8 * bytes),
            Element::Integer { .. } => "integers".into(),
            Element::String => "strings".into(),
            Element::Other(class) => format!("HDF5 type class {class}"),
        }
    }
}

impl H5 {
    fn close(&self, id: Hid, kind: Kind) {
        let f = &self.api.fns;
        // SAFETY: `id` is a handle of this kind that nothing else closes.
        unsafe {
            match kind {
                Kind::File => (f.H5Fclose)(id),
                Kind::Group => (f.H5Gclose)(id),
                Kind::Dataset => (f.H5Dclose)(id),
                Kind::Space => (f.H5Sclose)(id),
                Kind::Type => (f.H5Tclose)(id),
            };
        }
    }

    fn scoped(&self, id: Hid, kind: Kind) -> Option<Scoped<'_>> {
        (id >= 0).then_some(Scoped { h5: self, id, kind })
    }

    pub fn types(&self) -> Types {
        self.api.t
    }

    /// Opens `path` to read, or to read and write.
    pub fn open_file(&self, path: &Path, write: bool) -> Option<Scoped<'_>> {
        let mode = if write { F_ACC_RDWR } else { F_ACC_RDONLY };
        // SAFETY: a NUL-terminated name and a default property list.
        let id = unsafe { (self.api.fns.H5Fopen)(c_path(path).as_ptr(), mode, P_DEFAULT) };
        self.scoped(id, Kind::File)
    }

    /// Creates `path`, replacing any file there.
    pub fn create_file(&self, path: &Path) -> Option<Scoped<'_>> {
        // SAFETY: as in open_file.
        let id = unsafe {
            (self.api.fns.H5Fcreate)(c_path(path).as_ptr(), F_ACC_TRUNC, P_DEFAULT, P_DEFAULT)
        };
        self.scoped(id, Kind::File)
    }

    pub fn open_group(&self, loc: Hid, name: &str) -> Option<Scoped<'_>> {
        // SAFETY: `loc` is an open file or group; the name is NUL-terminated.
        let id = unsafe { (self.api.fns.H5Gopen2)(loc, c_name(name).as_ptr(), P_DEFAULT) };
        self.scoped(id, Kind::Group)
    }

    pub fn create_group(&self, loc: Hid, name: &str) -> Option<Scoped<'_>> {
        // SAFETY: as in open_group.
        let id = unsafe {
            (self.api.fns.H5Gcreate2)(loc, c_name(name).as_ptr(), P_DEFAULT, P_DEFAULT, P_DEFAULT)
        };
        self.scoped(id, Kind::Group)
    }

    pub fn open_dataset(&self, loc: Hid, name: &str) -> Option<Scoped<'_>> {
        // SAFETY: as in open_group.
        let id = unsafe { (self.api.fns.H5Dopen2)(loc, c_name(name).as_ptr(), P_DEFAULT) };
        self.scoped(id, Kind::Dataset)
    }

    /// Whether `loc` has a link `name` (a single path component, or a path whose parents exist).
    pub fn link_exists(&self, loc: Hid, name: &str) -> bool {
        // SAFETY: as in open_group.
        unsafe { (self.api.fns.H5Lexists)(loc, c_name(name).as_ptr(), P_DEFAULT) > 0 }
    }

    /// Removes the link `name` from `loc`.
    pub fn unlink(&self, loc: Hid, name: &str) -> bool {
        // SAFETY: as in open_group.
        unsafe { (self.api.fns.H5Ldelete)(loc, c_name(name).as_ptr(), P_DEFAULT) >= 0 }
    }

    /// The names of the links in group `loc`, in name order.
    pub fn member_names(&self, loc: Hid) -> Option<Vec<String>> {
        let f = &self.api.fns;
        let mut info = GroupInfo {
            storage_type: 0,
            nlinks: 0,
            max_corder: 0,
            mounted: [0; 8],
        };
        // SAFETY: `loc` is an open group; `info` has the room of an H5G_info_t.
        if unsafe { (f.H5Gget_info)(loc, &mut info) } < 0 {
            return None;
        }
        let dot = c".";
        (0..info.nlinks)
            .map(|i| {
                // SAFETY: the first call asks for the length; the second writes at most
                // `buf.len()` bytes, the last a NUL.
                unsafe {
                    let n = (f.H5Lget_name_by_idx)(
                        loc,
                        dot.as_ptr(),
                        INDEX_NAME,
                        ITER_INC,
                        i,
                        std::ptr::null_mut(),
                        0,
                        P_DEFAULT,
                    );
                    let n = usize::try_from(n).ok()?;
                    let mut buf = vec![0u8; n + 1];
                    let got = (f.H5Lget_name_by_idx)(
                        loc,
                        dot.as_ptr(),
                        INDEX_NAME,
                        ITER_INC,
                        i,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        P_DEFAULT,
                    );
                    (got >= 0).then(|| {
                        CStr::from_bytes_until_nul(&buf)
                            .map(|c| c.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    })
                }
            })
            .collect()
    }

    /// A dataset's element type.
    pub fn element(&self, ds: Hid) -> Option<Element> {
        let f = &self.api.fns;
        // SAFETY: `ds` is an open dataset; the type handle is closed by `Scoped`.
        unsafe {
            let t = self.scoped((f.H5Dget_type)(ds), Kind::Type)?;
            Some(match (f.H5Tget_class)(t.id) {
                T_FLOAT => Element::Float {
                    bytes: (f.H5Tget_size)(t.id),
                },
                T_INTEGER => Element::Integer {
                    signed: (f.H5Tget_sign)(t.id) != T_SGN_NONE,
                },
                T_STRING => Element::String,
                c => Element::Other(c),
            })
        }
    }

    /// A dataset's shape (empty for a scalar).
    pub fn shape(&self, ds: Hid) -> Option<Vec<usize>> {
        let f = &self.api.fns;
        // SAFETY: `ds` is an open dataset; `dims` has room for every dimension.
        unsafe {
            let s = self.scoped((f.H5Dget_space)(ds), Kind::Space)?;
            let n = usize::try_from((f.H5Sget_simple_extent_ndims)(s.id)).ok()?;
            let mut dims = vec![0u64; n];
            if (f.H5Sget_simple_extent_dims)(s.id, dims.as_mut_ptr(), std::ptr::null_mut()) < 0 {
                return None;
            }
            dims.into_iter().map(|d| usize::try_from(d).ok()).collect()
        }
    }

    /// The dataset's shape and all its values as `T`, converted by the library from the
    /// file's type to `mem` (one of [`Types`], matching `T`).
    pub fn read<T: bytemuck::Pod>(&self, ds: Hid, mem: Hid) -> Option<(Vec<usize>, Vec<T>)> {
        let shape = self.shape(ds)?;
        let mut v = vec![T::zeroed(); shape.iter().product()];
        // SAFETY: `v` holds the dataset's every element of `mem`, the size of T.
        let ok = unsafe {
            (self.api.fns.H5Dread)(ds, mem, S_ALL, S_ALL, P_DEFAULT, v.as_mut_ptr().cast())
        };
        (ok >= 0).then_some((shape, v))
    }

    /// A dataset of strings, each as stored without its padding.
    pub fn read_strings(&self, ds: Hid) -> Option<Vec<String>> {
        let f = &self.api.fns;
        let n: usize = self.shape(ds)?.iter().product();
        // SAFETY: the memory type is a copy of the file's (fixed length: read as stored) or a
        // variable-length C string type of its character set; the buffers have room for n
        // elements; the library's strings are freed with its allocator.
        unsafe {
            let ft = self.scoped((f.H5Dget_type)(ds), Kind::Type)?;
            if (f.H5Tis_variable_str)(ft.id) > 0 {
                let mt = self.scoped((f.H5Tcopy)(self.api.t.c_s1), Kind::Type)?;
                (f.H5Tset_size)(mt.id, T_VARIABLE);
                (f.H5Tset_cset)(mt.id, (f.H5Tget_cset)(ft.id));
                let mut ptrs = vec![std::ptr::null_mut::<c_char>(); n];
                if (f.H5Dread)(ds, mt.id, S_ALL, S_ALL, P_DEFAULT, ptrs.as_mut_ptr().cast()) < 0 {
                    return None;
                }
                Some(
                    ptrs.into_iter()
                        .map(|p| {
                            if p.is_null() {
                                return String::new();
                            }
                            let s = CStr::from_ptr(p).to_string_lossy().into_owned();
                            (f.H5free_memory)(p.cast());
                            s
                        })
                        .collect(),
                )
            } else {
                let size = (f.H5Tget_size)(ft.id);
                let mut buf = vec![0u8; n * size];
                if (f.H5Dread)(ds, ft.id, S_ALL, S_ALL, P_DEFAULT, buf.as_mut_ptr().cast()) < 0 {
                    return None;
                }
                Some(
                    buf.chunks(size.max(1))
                        .map(|c| {
                            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                            String::from_utf8_lossy(&c[..end]).trim_end().to_string()
                        })
                        .collect(),
                )
            }
        }
    }

    /// A new dataset `name` in `loc` of `shape`, element type `file` (one of [`Types`], or a
    /// string type), written from `data` of the memory type `mem`.
    pub fn write_dataset(
        &self,
        loc: Hid,
        name: &str,
        file: Hid,
        mem: Hid,
        shape: &[usize],
        data: &[u8],
    ) -> bool {
        let f = &self.api.fns;
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        // SAFETY: `data` holds the elements of `shape` in `mem` (the caller sizes it); every
        // handle is closed by `Scoped`.
        unsafe {
            let space = if dims.is_empty() {
                (f.H5Screate)(S_SCALAR)
            } else {
                (f.H5Screate_simple)(dims.len() as c_int, dims.as_ptr(), std::ptr::null())
            };
            let Some(space) = self.scoped(space, Kind::Space) else {
                return false;
            };
            let Some(ds) = self.scoped(
                (f.H5Dcreate2)(
                    loc,
                    c_name(name).as_ptr(),
                    file,
                    space.id,
                    P_DEFAULT,
                    P_DEFAULT,
                    P_DEFAULT,
                ),
                Kind::Dataset,
            ) else {
                return false;
            };
            (f.H5Dwrite)(ds.id, mem, S_ALL, S_ALL, P_DEFAULT, data.as_ptr().cast()) >= 0
        }
    }

    /// A fixed-length ASCII string type of `len` bytes.
    pub fn fixed_string(&self, len: usize) -> Option<Scoped<'_>> {
        let f = &self.api.fns;
        // SAFETY: a copy of the predefined C string type, resized.
        unsafe {
            let t = self.scoped((f.H5Tcopy)(self.api.t.c_s1), Kind::Type)?;
            ((f.H5Tset_size)(t.id, len.max(1)) >= 0).then_some(t)
        }
    }
}
