//! The system C compiler and the cache of the libraries it builds: the layer
//! under [`CpuProgram::from_c_source`](super::CpuProgram::from_c_source).
//!
//! Every call here returns [`Result`]; nothing above this layer runs a
//! process or opens a library. It knows nothing of the kernel ABI: it turns C
//! text into a loaded library.
//!
//! The cache is described on [`CompileOptions`].
//!
//! This cache is process-global state outside every loom model (as is the
//! registry), so it uses `std::sync` directly rather than the `sync` shim.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::SystemTime;

use crate::backend::Backend;
use crate::error::{Error, Result};

use super::Cpu;
use super::c_manifest::{
    Manifest, epoch_nanos, linked_libraries, modified, parse_depfile, write_atomically,
};

/// The flags [`CompileOptions::default`] passes to the C compiler.
///
/// `-ffp-contract=off` keeps `a * b + c` two roundings, as in Rust (clang
/// would otherwise fuse it into an FMA), so simple float code gives the same
/// bits as the Rust it replaces. No `-ffast-math`, for the same reason.
/// `-march=native` is safe for the cache: the key then includes the host CPU.
pub const DEFAULT_C_FLAGS: &[&str] = &["-O3", "-std=c11", "-march=native", "-ffp-contract=off"];

/// How [`CpuProgram::from_c_source`](super::CpuProgram::from_c_source)
/// compiles.
///
/// The compiler always also gets `-shared -fPIC -o OUT SOURCE` before the
/// flags and `-lm` after them, so `flags` hold only choices (optimisation,
/// language, `-D`, `-I`, `-l`).
///
/// The compiler runs with `LC_ALL=C`, so its messages read the same
/// everywhere.
///
/// # The cache
///
/// A library is keyed by everything that decides its code: the compiler (its
/// resolved path, size and modification time, as ccache checks it), the
/// arguments `$CC` carries, the flags, the host CPU when an argument says
/// `native`, `CPATH`, `C_INCLUDE_PATH` and `LIBRARY_PATH`, and the full
/// text compiled (ABI prelude, program name, source); and by the files the
/// compile read besides the text: every header the source included
/// (directly or not) and every static library a `-l` linked, recorded at compile
/// time and checked on every load. Edit a header, and the next
/// `from_c_source` compiles again.
///
/// - **In process**: a map from the key to the loaded library, held weakly: a
///   library stays loaded while a program uses it and is unloaded after the
///   last one is dropped. Threads asking for one key at once wait for a single
///   compile.
/// - **On disk**: `<dir>/<hash>-<files>.so`, the hash being FNV-1a 128 of
///   the key (stable across Rust releases, unlike std's hasher) and `files`
///   a digest of the included files' contents, so a library built from
///   other headers has another name (a loader would hand out the one
///   already loaded under a name). `<hash>.deps` lists those files with
///   their sizes, times and hashes. The compiler writes to a name unique to
///   the process and call, then that file is renamed over the final name.
///   Rename is atomic, so a reader sees a whole library or none, and
///   processes compiling one key at once all succeed (the last rename wins;
///   the files hold the same code). The text compiled is kept beside it as
///   `<hash>-<files>.c`, to read. A cached file that does not load (cut
///   short by a full disk, say) is compiled again and replaced. Nothing is
///   evicted: delete the directory to clear it.
///
/// The directory is [`cache_dir`](Self::cache_dir), else `$HWQUEUE_CACHE_DIR`,
/// else `hwqueue-c-kernels-$USER` under [`std::env::temp_dir`]. The default
/// one is created private (mode 0700), and on Linux it is refused unless it
/// belongs to this user and nobody else may write it: the temporary directory
/// is shared, and a library planted there would run in this process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Compiler flags; default [`DEFAULT_C_FLAGS`].
    pub flags: Vec<String>,
    /// The compiler: a path, or a name looked up in `PATH`. `None`: `$CC`
    /// (which may carry arguments, as in `ccache gcc`), else `cc`.
    pub compiler: Option<PathBuf>,
    /// The on-disk cache. `None`: `$HWQUEUE_CACHE_DIR`, else a private
    /// folder under [`std::env::temp_dir`].
    pub cache_dir: Option<PathBuf>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self {
            flags: DEFAULT_C_FLAGS
                .iter()
                .map(|flag| (*flag).to_owned())
                .collect(),
            compiler: None,
            cache_dir: None,
        }
    }
}

/// Where the library of a program compiled from C came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// The compiler ran.
    Compiled,
    /// The library was in the on-disk cache and was loaded from there.
    LoadedFromDisk,
    /// Another program of this process already had it loaded.
    AlreadyLoaded,
}

/// A loaded library built by the C compiler, and the files it was built
/// from besides its text.
pub(crate) struct CompiledLibrary {
    library: libloading::Library,
    path: PathBuf,
    manifest: Manifest,
}

impl CompiledLibrary {
    /// The loaded library.
    pub(crate) fn library(&self) -> &libloading::Library {
        &self.library
    }

    /// The file in the cache it was loaded from.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Loads the library for `text` (the whole C file) built with `options`:
/// from this process, else the on-disk cache, else by running the compiler.
/// `program` names the kernel in errors.
pub(crate) fn load_or_compile(
    program: &str,
    text: &str,
    options: &CompileOptions,
) -> Result<(Arc<CompiledLibrary>, CacheOutcome)> {
    let compiler = Compiler::resolve(options)?;
    let key = cache_key(&compiler, &options.flags, text);
    let digest = fnv1a_128(&key);
    let slot = {
        let mut loaded = lock(loaded_libraries());
        // Forget keys whose library was unloaded. A slot only this map holds
        // is locked by nobody (threads lock a slot through their own `Arc`,
        // taken under the map's lock), so this never blocks.
        loaded.retain(|_, slot| Arc::strong_count(slot) > 1 || lock(slot).strong_count() > 0);
        loaded.entry(key).or_default().clone()
    };
    let mut held = lock(&slot);
    // Loaded already, and built from what the files hold now.
    if let Some(library) = held.upgrade()
        && library.manifest.is_current()
    {
        return Ok((library, CacheOutcome::AlreadyLoaded));
    }
    let (library, outcome) = load_or_build(program, &compiler, options, text, digest)?;
    let library = Arc::new(library);
    *held = Arc::downgrade(&library);
    Ok((library, outcome))
}

/// Key → the library loaded for it, if a program still holds it.
type Slot = Mutex<Weak<CompiledLibrary>>;

fn loaded_libraries() -> &'static Mutex<HashMap<Vec<u8>, Arc<Slot>>> {
    static LOADED: OnceLock<Mutex<HashMap<Vec<u8>, Arc<Slot>>>> = OnceLock::new();
    LOADED.get_or_init(Mutex::default)
}

/// Nothing here panics while holding a lock, but a poisoned map is still a
/// consistent map: keep using it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn load_or_build(
    program: &str,
    compiler: &Compiler,
    options: &CompileOptions,
    text: &str,
    digest: u128,
) -> Result<(CompiledLibrary, CacheOutcome)> {
    let dir = cache_dir(options)?;
    let stem = format!("{digest:032x}");
    let manifest_path = dir.join(format!("{stem}.deps"));
    let library_path = |manifest: &Manifest| {
        dir.join(format!(
            "{stem}-{:016x}{}",
            manifest.digest(),
            std::env::consts::DLL_SUFFIX
        ))
    };
    // A library built from files that still hold what they held. One that
    // does not load (a disk filled up mid-write, a stray file) is built
    // again.
    if let Some(manifest) = Manifest::read(&manifest_path)
        && manifest.is_current()
        && let Ok(library) = open(&library_path(&manifest), manifest.clone())
    {
        return Ok((library, CacheOutcome::LoadedFromDisk));
    }
    let (scratch, manifest) = compile(program, compiler, options, text, &dir, &stem)?;
    let path = library_path(&manifest);
    fs::rename(&scratch.output, &path)
        .map_err(cache_io("moving a compiled C kernel into place"))?;
    // Keep the text beside its library, to read; a lost race is harmless.
    let _ = fs::rename(&scratch.source, path.with_extension("c"));
    // Without a manifest on disk the library is compiled again next time,
    // never loaded stale: a path that cannot be written down is no error.
    if let Some(text) = manifest.to_text() {
        write_atomically(&manifest_path, &scratch.depfile, &text)
            .map_err(cache_io("writing a C kernel's dependencies into the cache"))?;
    }
    match open(&path, manifest) {
        Ok(library) => Ok((library, CacheOutcome::Compiled)),
        Err(error) => {
            // It compiled but does not load: an undefined function, most
            // likely. Leave no library behind that cannot be loaded.
            let _ = fs::remove_file(&path);
            Err(Error::Compile {
                program: program.to_owned(),
                compiler: compiler.shown(),
                output: format!(
                    "the library built does not load: {error} (does the source call a function \
                     no library provides? link it with `-l...` in the flags)"
                ),
            })
        }
    }
}

/// Runs the compiler on `text`; returns its scratch files (the library is
/// `output`) and what the library was built from besides the text.
fn compile(
    program: &str,
    compiler: &Compiler,
    options: &CompileOptions,
    text: &str,
    dir: &Path,
    stem: &str,
) -> Result<(Scratch, Manifest)> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let unique = format!(
        "{stem}.{}.{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    );
    let scratch = Scratch {
        source: dir.join(format!("{unique}.c")),
        output: dir.join(format!("{unique}.tmp")),
        depfile: dir.join(format!("{unique}.d")),
    };
    fs::write(&scratch.source, text).map_err(cache_io("writing a C kernel into the cache"))?;
    // Files the compiler reads that change from here on may not be what it
    // read (see `c_manifest`). Modification times come from the kernel's
    // coarse clock, which may lag the system time by a tick: the source's
    // own, just written, bounds it (a header written after it is at or
    // after it on the same clock).
    let now = epoch_nanos(SystemTime::now());
    let started = fs::metadata(&scratch.source).map_or(now, |meta| modified(&meta).min(now));
    let ran = Command::new(&compiler.path)
        .args(&compiler.args)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&scratch.output)
        .arg(&scratch.source)
        // Every file the preprocessor reads, into a make rule.
        .args(["-MD", "-MT", "hwq", "-MF"])
        .arg(&scratch.depfile)
        .args(&options.flags)
        .arg("-lm")
        // Untranslated messages with plain quotes: the same output anywhere.
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| compiler.not_found(&format!("it could not be run ({e})")))?;
    if !ran.status.success() {
        let mut output = String::from_utf8_lossy(&ran.stderr).trim_end().to_owned();
        let stdout = String::from_utf8_lossy(&ran.stdout);
        if !stdout.trim().is_empty() {
            output = format!("{output}\n{}", stdout.trim_end());
        }
        if output.is_empty() {
            output = format!("it exited with {} and printed nothing", ran.status);
        }
        return Err(Error::Compile {
            program: program.to_owned(),
            compiler: compiler.shown(),
            output,
        });
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    let headers = fs::read_to_string(&scratch.depfile)
        .map(|rule| parse_depfile(&rule, &scratch.source, &cwd))
        .unwrap_or_default();
    // The static libraries of the flags' `-l`s: their code is copied into
    // the kernel's library. A shared one (as the `-lm` added above) is
    // loaded when the kernel's library is, so it follows the system and
    // needs no compile when it changes.
    let libraries = linked_libraries(&compiler.path, &compiler.args, &options.flags)
        .into_iter()
        .filter(|path| path.extension().is_some_and(|extension| extension == "a"));
    Ok((
        scratch,
        Manifest::capture(headers.into_iter().chain(libraries), (started, now)),
    ))
}

/// The compiler's scratch files, removed however the compile ends (a file
/// already renamed into place is no longer there to remove).
struct Scratch {
    source: PathBuf,
    output: PathBuf,
    depfile: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.source);
        let _ = fs::remove_file(&self.output);
        let _ = fs::remove_file(&self.depfile);
    }
}

fn open(
    path: &Path,
    manifest: Manifest,
) -> std::result::Result<CompiledLibrary, libloading::Error> {
    // SAFETY: loading runs the library's initialisers. The library is one
    // this layer built (or a previous run built) from C text whose caller
    // vouched for it (`CpuProgram::from_c_source`'s `# Safety`); the cache
    // directory is the user's own (checked for the default one). `RTLD_NOW`
    // resolves every symbol here, so a missing function is an error now
    // rather than a crash when the kernel first calls it.
    #[cfg(unix)]
    let library = unsafe {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        Library::open(Some(path), RTLD_NOW | RTLD_LOCAL)?.into()
    };
    // SAFETY: as above.
    #[cfg(not(unix))]
    let library = unsafe { libloading::Library::new(path)? };
    Ok(CompiledLibrary {
        library,
        path: path.to_owned(),
        manifest,
    })
}

/// The compiler to run.
struct Compiler {
    /// Resolved: a file that exists.
    path: PathBuf,
    /// Arguments that came with `$CC` (`ccache gcc`: `gcc`).
    args: Vec<OsString>,
    /// Its size and modification time, for the cache key.
    size: u64,
    modified: u128,
}

impl Compiler {
    fn resolve(options: &CompileOptions) -> Result<Self> {
        let (program, args, origin) = match &options.compiler {
            Some(path) => (
                path.clone().into_os_string(),
                Vec::new(),
                "CompileOptions::compiler",
            ),
            None => match std::env::var_os("CC") {
                Some(cc) if !cc.to_string_lossy().trim().is_empty() => {
                    let cc = cc.to_string_lossy().into_owned();
                    let mut words = cc.split_whitespace().map(OsString::from);
                    let program = words.next().unwrap_or_default();
                    (program, words.collect(), "$CC")
                }
                _ => (OsString::from("cc"), Vec::new(), "the default"),
            },
        };
        let Some(path) = find_program(&program) else {
            let where_ = if Path::new(&program).components().count() > 1 {
                "does not exist"
            } else {
                "is not on PATH"
            };
            return Err(no_compiler(&format!(
                "`{}` ({origin}) {where_}",
                program.to_string_lossy()
            )));
        };
        let meta =
            fs::metadata(&path).map_err(|e| no_compiler(&format!("`{}`: {e}", path.display())))?;
        Ok(Self {
            path,
            args,
            size: meta.len(),
            modified: modified(&meta),
        })
    }

    /// The command as a person would type it, for errors.
    fn shown(&self) -> String {
        let mut shown = self.path.display().to_string();
        for arg in &self.args {
            shown.push(' ');
            shown.push_str(&arg.to_string_lossy());
        }
        shown
    }

    fn not_found(&self, why: &str) -> Error {
        no_compiler(&format!("`{}`: {why}", self.shown()))
    }
}

fn no_compiler(detail: &str) -> Error {
    Error::NoDriver {
        backend: Cpu::ID,
        detail: format!(
            "no C compiler found: {detail}; install gcc or set CC (or \
             `CompileOptions::compiler`) to a C compiler"
        ),
    }
}

/// `program` as given when it names a path, else the first match in `PATH`.
fn find_program(program: &OsStr) -> Option<PathBuf> {
    let given = Path::new(program);
    if given.as_os_str().is_empty() {
        return None;
    }
    if given.components().count() > 1 {
        return given.is_file().then(|| given.to_owned());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(given))
        .find(|candidate| candidate.is_file())
}

/// Every input that decides the library's code, each field length-prefixed
/// so no two inputs give the same bytes.
fn cache_key(compiler: &Compiler, flags: &[String], text: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(text.len() + 512);
    let mut field = |bytes: &[u8]| {
        key.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        key.extend_from_slice(bytes);
    };
    field(b"hwqueue C kernel cache, format 2");
    field(compiler.path.as_os_str().as_encoded_bytes());
    field(&compiler.size.to_le_bytes());
    field(&compiler.modified.to_le_bytes());
    for arg in &compiler.args {
        field(arg.as_encoded_bytes());
    }
    field(b"--");
    for flag in flags {
        field(flag.as_bytes());
    }
    field(b"--");
    // The search paths the environment adds for headers and libraries: the
    // manifest records the files found, not where else one would be found.
    for variable in ["CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH"] {
        field(variable.as_bytes());
        match std::env::var_os(variable) {
            Some(value) => field(value.as_encoded_bytes()),
            None => field(b"(unset)"),
        }
    }
    field(b"--");
    let native = compiler
        .args
        .iter()
        .map(|arg| arg.to_string_lossy())
        .chain(flags.iter().map(|flag| flag.as_str().into()))
        .any(|arg| arg.contains("native"));
    if native {
        field(host_cpu().as_bytes());
    }
    field(text.as_bytes());
    key
}

/// What `-march=native` would see: the architecture, and on Linux the first
/// CPU's identity and feature lines from `/proc/cpuinfo`. A cache shared by
/// machines of different CPUs then never hands one the other's code.
fn host_cpu() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        const FIELDS: &[&str] = &[
            "vendor_id",
            "cpu family",
            "model",
            "model name",
            "stepping",
            "flags",
            "Features",
            "CPU implementer",
            "CPU architecture",
            "CPU variant",
            "CPU part",
            "isa",
        ];
        let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let first_cpu = info.split("\n\n").next().unwrap_or_default();
        let mut host = String::from(std::env::consts::ARCH);
        for line in first_cpu.lines() {
            let name = line.split(':').next().unwrap_or_default().trim();
            if FIELDS.contains(&name) {
                host.push('\n');
                host.push_str(line);
            }
        }
        host
    })
}

/// FNV-1a, 128 bits: a hash whose value is fixed by its definition, so file
/// names stay the same across Rust releases and processes.
pub(crate) fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u128::from(byte)).wrapping_mul(PRIME)
    })
}

fn cache_dir(options: &CompileOptions) -> Result<PathBuf> {
    let chosen = options.cache_dir.clone().or_else(|| {
        std::env::var_os("HWQUEUE_CACHE_DIR")
            .filter(|dir| !dir.is_empty())
            .map(PathBuf::from)
    });
    let is_default = chosen.is_none();
    let dir = chosen.unwrap_or_else(default_cache_dir);
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(&dir)
        .map_err(cache_io("creating the C kernel cache directory"))?;
    if is_default {
        check_private(&dir)?;
    }
    Ok(dir)
}

fn default_cache_dir() -> PathBuf {
    let user: String = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "user".to_owned())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    std::env::temp_dir().join(format!("hwqueue-c-kernels-{user}"))
}

/// Refuses a default cache directory that someone else could write into.
#[cfg(target_os = "linux")]
fn check_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir_meta = fs::metadata(dir).map_err(cache_io("checking the C kernel cache directory"))?;
    // `/proc/self` belongs to this process's user.
    let me = fs::metadata("/proc/self").map(|meta| meta.uid()).ok();
    if me.is_some_and(|uid| uid != dir_meta.uid()) || dir_meta.mode() & 0o022 != 0 {
        return Err(Error::System {
            what: "using the C kernel cache directory",
            detail: format!(
                "`{}` belongs to another user or others may write it, so a library in it could \
                 have been planted; remove it, or set HWQUEUE_CACHE_DIR to a directory only you \
                 can write",
                dir.display()
            ),
        });
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn check_private(_dir: &Path) -> Result<()> {
    Ok(())
}

fn cache_io(what: &'static str) -> impl Fn(io::Error) -> Error {
    move |e| Error::System {
        what,
        detail: format!(
            "{e}; make the cache directory writable, or point HWQUEUE_CACHE_DIR (or \
             `CompileOptions::cache_dir`) at one that is"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::fnv1a_128;

    /// The published FNV-1a 128 test vectors: file names depend on them.
    #[test]
    fn fnv1a_128_matches_the_reference() {
        assert_eq!(fnv1a_128(b""), 0x6c62272e07bb014262b821756295c58d);
        assert_eq!(fnv1a_128(b"a"), 0xd228cb696f1a8caf78912b704e4a8964);
        assert_eq!(fnv1a_128(b"foobar"), 0x343e1662793c64bf6f0d3597ba446f18);
    }
}
