//! What a C kernel's library was built from besides its text: the files the
//! compiler read (every header the source included, directly or not) and
//! the static libraries `-l` flags linked. The cache in `c_compiler` keys a library
//! by its text, flags and compiler, and keeps this manifest beside it; a
//! library is used only while every file of its manifest is unchanged.
//!
//! A file is unchanged when its size and modification time are (no read),
//! or, when either moved, its contents hash the same (a header touched but
//! not edited does not cost a compile). The hash is FNV-1a 128 of the
//! contents, as for the cache's file names.
//!
//! A file modified at or after the moment the compiler started may have
//! been read before that edit: what it holds now is not known to be what
//! the library was built from. Its stamp records no contents, so it never
//! counts as unchanged, and the next load compiles again (as ccache does
//! for an "include file too new").
//!
//! Not seen: a header that a change of the search path would now find
//! *instead* of the one recorded (a new file of the same name in an earlier
//! `-I` directory). The search path's environment variables (`CPATH`,
//! `C_INCLUDE_PATH`, `LIBRARY_PATH`) are part of the cache key; new files
//! shadowing old ones are not, as with ccache.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use super::c_compiler::fnv1a_128;

/// The first line of a manifest file.
const HEADER: &str = "hwqueue C kernel dependencies, format 1";

/// The files a library was built from, as they were then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Manifest {
    files: Vec<FileStamp>,
    /// When some file was too new to trust (see [`FileStamp::now`]): the
    /// compile's start, mixed into the [`digest`](Self::digest) so that the
    /// library gets a name of its own. Such a manifest is never current,
    /// so it is never read back; `None` for a settled one.
    unsettled: Option<u128>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    path: PathBuf,
    size: u64,
    modified: u128,
    hash: u128,
}

/// The hash of a stamp whose contents are not known (see the module docs).
const UNKNOWN: u128 = 0;

impl FileStamp {
    /// The file as it is now, or `None` when it cannot be read. Modified at
    /// or after `compile_started` (nanoseconds since the Unix epoch), its
    /// contents are recorded as unknown.
    fn now(path: &Path, compile_started: u128) -> Option<Self> {
        let meta = fs::metadata(path).ok()?;
        let modified = modified(&meta);
        let hash = if modified >= compile_started {
            UNKNOWN
        } else {
            fnv1a_128(&fs::read(path).ok()?)
        };
        Some(Self {
            path: path.to_owned(),
            size: meta.len(),
            modified,
            hash,
        })
    }

    /// Whether the file still holds what it held.
    fn is_current(&self) -> bool {
        if self.hash == UNKNOWN {
            return false;
        }
        let Ok(meta) = fs::metadata(&self.path) else {
            return false;
        };
        if meta.len() == self.size && modified(&meta) == self.modified {
            return true;
        }
        fs::read(&self.path).is_ok_and(|contents| fnv1a_128(&contents) == self.hash)
    }
}

/// A file's modification time in nanoseconds since the Unix epoch (0 when
/// the platform cannot say).
pub(crate) fn modified(meta: &fs::Metadata) -> u128 {
    meta.modified().map_or(0, epoch_nanos)
}

/// `time` in nanoseconds since the Unix epoch (0 before it): how stamps
/// and the compile's start are compared.
pub(crate) fn epoch_nanos(time: std::time::SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos())
}

impl Manifest {
    /// Stamps `paths` as they are now (each once; unreadable ones are left
    /// out: the compile that named them read them, so they exist), for a
    /// compile that started at `compile_started` (nanoseconds since the
    /// Unix epoch, on the files' clock; see the module docs). `nonce` (the
    /// system time of that start, in nanoseconds) keeps the digests of two
    /// compiles that each found a file too new apart, however coarse the
    /// files' clock.
    pub(crate) fn capture(
        paths: impl IntoIterator<Item = PathBuf>,
        (compile_started, nonce): (u128, u128),
    ) -> Self {
        let mut paths: Vec<PathBuf> = paths.into_iter().collect();
        paths.sort();
        paths.dedup();
        let files: Vec<FileStamp> = paths
            .iter()
            .filter_map(|path| FileStamp::now(path, compile_started))
            .collect();
        let unsettled = files
            .iter()
            .any(|file| file.hash == UNKNOWN)
            .then_some(nonce);
        Self { files, unsettled }
    }

    /// Whether every file still holds what it held when captured.
    pub(crate) fn is_current(&self) -> bool {
        self.files.iter().all(FileStamp::is_current)
    }

    /// A digest of the files' paths and contents: it names the library
    /// built from them, so a library built from other contents has another
    /// name (a loader hands out the library already loaded under a name).
    /// Where a file's contents are unknown, the compile's start stands in,
    /// so two such compiles never share a name.
    pub(crate) fn digest(&self) -> u64 {
        let mut bytes = Vec::new();
        if let Some(started) = self.unsettled {
            bytes.extend_from_slice(&started.to_le_bytes());
        }
        for file in &self.files {
            bytes.extend_from_slice(file.path.as_os_str().as_encoded_bytes());
            bytes.push(0);
            bytes.extend_from_slice(&file.hash.to_le_bytes());
        }
        let hash = fnv1a_128(&bytes);
        (hash ^ (hash >> 64)) as u64
    }

    /// The manifest in `path`, or `None` when there is none or it does not
    /// parse (the library is then built again).
    pub(crate) fn read(path: &Path) -> Option<Self> {
        let text = fs::read_to_string(path).ok()?;
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let files = lines
            .map(|line| {
                let mut fields = line.splitn(4, ' ');
                Some(FileStamp {
                    size: fields.next()?.parse().ok()?,
                    modified: fields.next()?.parse().ok()?,
                    hash: u128::from_str_radix(fields.next()?, 16).ok()?,
                    path: PathBuf::from(fields.next()?),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let unsettled = None;
        Some(Self { files, unsettled })
    }

    /// The manifest as a file's text, or `None` when a path cannot be
    /// written on one line of UTF-8 (the library is then not cached).
    pub(crate) fn to_text(&self) -> Option<String> {
        let mut text = format!("{HEADER}\n");
        for file in &self.files {
            let path = file.path.to_str().filter(|path| !path.contains('\n'))?;
            text.push_str(&format!(
                "{} {} {:032x} {path}\n",
                file.size, file.modified, file.hash
            ));
        }
        Some(text)
    }
}

/// The prerequisites of a make rule written by the compiler's `-MD -MF`,
/// made absolute against `cwd`, without `source` (the text compiled, which
/// is in the cache key already).
pub(crate) fn parse_depfile(text: &str, source: &Path, cwd: &Path) -> Vec<PathBuf> {
    let joined = text.replace("\\\r\n", " ").replace("\\\n", " ");
    // Only the first rule: `-MD` writes one, with no phony targets.
    let rule = joined.lines().next().unwrap_or_default();
    // The target (ours has no `:` in it) ends at the first ": ".
    let Some((_, prerequisites)) = rule.split_once(": ") else {
        return Vec::new();
    };
    let mut paths = Vec::new();
    let mut current = String::new();
    let mut chars = prerequisites.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if matches!(chars.peek(), Some(' ' | '#' | '\\')) => {
                current.extend(chars.next());
            }
            '$' if chars.peek() == Some(&'$') => {
                chars.next();
                current.push('$');
            }
            c if c.is_whitespace() => {
                if !current.is_empty() {
                    paths.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        paths.push(current);
    }
    paths
        .into_iter()
        .map(|path| cwd.join(path))
        .filter(|path| path != source)
        .collect()
}

/// The files the `-l` flags among `args` link, resolved as the linker would:
/// the `-L` directories, then `$LIBRARY_PATH`, then the compiler's own
/// search path (`-print-file-name`), directory by directory, taking in each
/// the shared library before the static one (only the static one with
/// `-static`). Libraries that cannot be resolved are left out (the link
/// would have failed on them).
pub(crate) fn linked_libraries(
    compiler: &Path,
    compiler_args: &[OsString],
    args: &[String],
) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut static_only = false;
    let mut words = args.iter().map(String::as_str);
    while let Some(word) = words.next() {
        static_only |= word == "-static";
        if let Some(dir) = word.strip_prefix("-L") {
            let dir = if dir.is_empty() {
                words.next()
            } else {
                Some(dir)
            };
            dirs.extend(dir.map(PathBuf::from));
        } else if let Some(name) = word.strip_prefix("-l") {
            let name = if name.is_empty() {
                words.next()
            } else {
                Some(name)
            };
            names.extend(name.map(str::to_owned));
        }
    }
    if let Some(path) = std::env::var_os("LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    names
        .iter()
        .filter_map(|name| {
            // `-l:libfoo.a` names the file itself.
            let exact = name.strip_prefix(':').map(str::to_owned);
            let shared = format!("lib{name}.so");
            let archive = format!("lib{name}.a");
            let files: &[&String] = match &exact {
                Some(file) => &[file],
                None if static_only => &[&archive],
                None => &[&shared, &archive],
            };
            dirs.iter()
                .find_map(|dir| {
                    files
                        .iter()
                        .map(|file| dir.join(file))
                        .find(|path| path.is_file())
                })
                .or_else(|| {
                    files
                        .iter()
                        .find_map(|file| print_file_name(compiler, compiler_args, file))
                })
        })
        .collect()
}

/// Where the compiler finds `file` on its own search path (`cc
/// -print-file-name=FILE` prints the bare name when it finds none).
fn print_file_name(compiler: &Path, compiler_args: &[OsString], file: &str) -> Option<PathBuf> {
    let output = Command::new(compiler)
        .args(compiler_args)
        .arg(format!("-print-file-name={file}"))
        .env("LC_ALL", "C")
        .output()
        .ok()?;
    let printed = String::from_utf8(output.stdout).ok()?;
    let path = PathBuf::from(printed.trim());
    (output.status.success() && path.is_absolute() && path.is_file()).then_some(path)
}

/// Writes `text` to `path` whole or not at all: through `scratch`, renamed.
pub(crate) fn write_atomically(path: &Path, scratch: &Path, text: &str) -> io::Result<()> {
    fs::write(scratch, text)?;
    fs::rename(scratch, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_depfile_gives_its_prerequisites_but_the_source() {
        let text = "hwq: /tmp/k.c /usr/include/stdint.h \\\n inc/my\\ header.h \\\n  /a/$$b.h\n";
        let deps = parse_depfile(text, Path::new("/tmp/k.c"), Path::new("/work"));
        assert_eq!(
            deps,
            [
                PathBuf::from("/usr/include/stdint.h"),
                PathBuf::from("/work/inc/my header.h"),
                PathBuf::from("/a/$b.h"),
            ]
        );
    }

    #[test]
    fn a_manifest_reads_back_as_written_and_notices_a_change() {
        let dir = std::env::temp_dir().join(format!("hwq-manifest-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let header = dir.join("a header.h");
        fs::write(&header, "#define X 1\n").unwrap();
        let manifest = Manifest::capture([header.clone(), header.clone()], (u128::MAX, u128::MAX));
        let text = manifest.to_text().unwrap();
        let file = dir.join("m.deps");
        fs::write(&file, &text).unwrap();
        assert_eq!(Manifest::read(&file), Some(manifest.clone()));
        assert!(manifest.is_current());
        let digest = manifest.digest();
        fs::write(&header, "#define X 2\n").unwrap();
        assert!(!manifest.is_current());
        assert_ne!(
            Manifest::capture([header.clone()], (u128::MAX, u128::MAX)).digest(),
            digest
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A header edited while the compiler ran (here: modified at or after
    /// the compile's start) may not be what the library was built from: it
    /// never counts as unchanged, however long it stays as it is. Failed
    /// before this rule: the stamp of the new contents matched.
    #[test]
    fn a_file_modified_after_the_compile_started_is_never_current() {
        let dir = std::env::temp_dir().join(format!("hwq-manifest-new-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let header = dir.join("generated.h");
        fs::write(&header, "#define X 1\n").unwrap();
        let written = modified(&fs::metadata(&header).unwrap());
        let too_new = Manifest::capture([header.clone()], (written, written));
        assert!(!too_new.is_current());
        let settled = Manifest::capture([header.clone()], (written + 1, written + 1));
        assert!(settled.is_current());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The linker searches directory by directory, the shared library
    /// before the static one in each: a static library in an earlier
    /// directory wins over a shared one in a later one, and `-static` takes
    /// only static ones. Failed before: every directory was searched for
    /// the `.so` first, so the `.so` of the later directory was named (and
    /// then left out as shared), and the `.a` really linked went untracked.
    #[test]
    fn libraries_resolve_in_the_linkers_order() {
        let root = std::env::temp_dir().join(format!("hwq-libs-{}", std::process::id()));
        let (first, second) = (root.join("first"), root.join("second"));
        fs::create_dir_all(&first).unwrap();
        fs::create_dir_all(&second).unwrap();
        fs::write(first.join("libhwqfoo.a"), "!<arch>\n").unwrap();
        fs::write(second.join("libhwqfoo.so"), "").unwrap();
        fs::write(second.join("libhwqbar.so"), "").unwrap();
        fs::write(second.join("libhwqbar.a"), "!<arch>\n").unwrap();
        let args = |extra: &[&str]| {
            let mut args = vec![
                format!("-L{}", first.display()),
                format!("-L{}", second.display()),
                "-lhwqfoo".to_owned(),
                "-lhwqbar".to_owned(),
            ];
            args.extend(extra.iter().map(|word| (*word).to_owned()));
            args
        };
        let none = Path::new("/nonexistent/cc");
        assert_eq!(
            linked_libraries(none, &[], &args(&[])),
            [first.join("libhwqfoo.a"), second.join("libhwqbar.so")]
        );
        assert_eq!(
            linked_libraries(none, &[], &args(&["-static"])),
            [first.join("libhwqfoo.a"), second.join("libhwqbar.a")]
        );
        // `-l:FILE` names the file (review helper-56: on 2590841 it looked
        // for `lib:libhwqbar.a.so` and left the archive untracked).
        assert_eq!(
            linked_libraries(none, &[], &args(&["-l:libhwqbar.a"])),
            [
                first.join("libhwqfoo.a"),
                second.join("libhwqbar.so"),
                second.join("libhwqbar.a")
            ]
        );
        fs::remove_dir_all(&root).unwrap();
    }

    /// Two compiles that each found a header too new to trust must not
    /// share a library name: a loader would hand the second the first's
    /// library, built from other contents. Failed before: both stamps
    /// hashed as unknown, so the digests were equal.
    #[test]
    fn compiles_of_unsettled_headers_never_share_a_library_name() {
        let dir = std::env::temp_dir().join(format!("hwq-manifest-twice-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let header = dir.join("future.h");
        fs::write(&header, "#define X 1\n").unwrap();
        let written = modified(&fs::metadata(&header).unwrap());
        let first = Manifest::capture([header.clone()], (written, written));
        fs::write(&header, "#define X 2\n").unwrap();
        let second = Manifest::capture([header.clone()], (written + 1, written + 1));
        assert_ne!(first.digest(), second.digest());
        // Started on the same tick of a coarse file clock, the two are
        // still apart by their system-time nonces (review helper-57: on
        // 098a944 the start on the file clock was the nonce).
        let third = Manifest::capture([header.clone()], (written, written + 7));
        assert_ne!(first.digest(), third.digest());
        fs::remove_dir_all(&dir).unwrap();
    }
}
