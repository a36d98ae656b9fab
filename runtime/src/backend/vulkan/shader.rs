//! GLSL compute shaders compiled to SPIR-V in process (shaderc: glslang, then the SPIRV-Tools
//! optimizer), for the Vulkan 1.2 environment (SPIR-V 1.5), cached on disk.
//!
//! The cache holds one file per source, `<16 hex digits>.spv`, the FNV-1a 64 hash of the
//! compile settings and the source, holding the module's words little-endian. An entry that is
//! not a whole number of words or does not start with the SPIR-V header is recompiled and
//! replaced, never trusted. Entries are written to a temporary file and renamed, so a reader
//! never sees half of one. A cache that cannot be written costs the next run a compile, nothing
//! else.

use super::error::{is_spirv, VulkanError};
use aubier_kernels_gen::gpu::fnv1a;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Hashed before the source: a change of the compile settings must not read modules compiled
/// under the old ones.
const SETTINGS: &str = "aubier spirv v1: glsl compute, vulkan 1.2, optimize performance\n";

/// Compiles the GLSL compute shader `source` (entry point `main`) to SPIR-V words, through the
/// cache directory of this user ([`compile_glsl_in`] with `$AUBIER_SPIRV_CACHE`, else
/// `$XDG_CACHE_HOME/aubier/spirv`, else `~/.cache/aubier/spirv`; no cache without any of them).
/// `name` names the shader in the compiler's messages.
///
/// Errors: [`VulkanError::Compile`] with the compiler's messages.
pub fn compile_glsl(source: &str, name: &str) -> Result<Vec<u32>, VulkanError> {
    compile_glsl_in(
        source,
        name,
        cache_dir_from(|var| std::env::var_os(var)).as_deref(),
    )
}

/// [`compile_glsl`] with the cache in `cache` (`None`: always compile). A valid entry
/// ([`cache_file`]) is returned as it is; a missing or corrupt one is compiled and written.
///
/// Errors: [`VulkanError::Compile`] with the compiler's messages (a cache that cannot be read
/// or written is not an error: the shader is compiled, a warning logged).
pub fn compile_glsl_in(
    source: &str,
    name: &str,
    cache: Option<&Path>,
) -> Result<Vec<u32>, VulkanError> {
    let file = cache.map(|dir| cache_file(dir, source));
    if let Some(file) = &file {
        match read_words(file) {
            Ok(Some(words)) => return Ok(words),
            Ok(None) => tracing::warn!(
                "SPIR-V cache entry {} is corrupt; recompiling `{name}`",
                file.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("reading SPIR-V cache entry {}: {e}", file.display()),
        }
    }
    let words = compile(source, name)?;
    if let Some(file) = &file {
        if let Err(e) = write_words(file, &words) {
            tracing::warn!("writing SPIR-V cache entry {}: {e}", file.display());
        }
    }
    Ok(words)
}

/// The cache entry of `source` in `dir`: `<FNV-1a 64 of the settings and the source, 16 hex
/// digits>.spv`.
pub fn cache_file(dir: &Path, source: &str) -> PathBuf {
    let mut keyed = SETTINGS.as_bytes().to_vec();
    keyed.extend_from_slice(source.as_bytes());
    dir.join(format!("{:016x}.spv", fnv1a(&keyed)))
}

/// The cache directory given the environment `var` reads: `AUBIER_SPIRV_CACHE`, else
/// `$XDG_CACHE_HOME/aubier/spirv` (an absolute path, as the XDG spec asks), else
/// `$HOME/.cache/aubier/spirv`; empty values count as unset.
fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = set("AUBIER_SPIRV_CACHE") {
        return Some(dir);
    }
    let base = set("XDG_CACHE_HOME")
        .filter(|d| d.is_absolute())
        .or_else(|| set("HOME").map(|home| home.join(".cache")))?;
    Some(base.join("aubier").join("spirv"))
}

/// The words of cache entry `file`; `Ok(None)` when it is not a SPIR-V module (a length that is
/// not whole words, a missing header).
fn read_words(file: &Path) -> std::io::Result<Option<Vec<u32>>> {
    let bytes = std::fs::read(file)?;
    if !bytes.len().is_multiple_of(4) {
        return Ok(None);
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    Ok(is_spirv(&words).then_some(words))
}

/// Writes `words` to `file` (its directory made if need be) through a temporary file renamed
/// over it.
fn write_words(file: &Path, words: &[u32]) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    // Unique per process and call: concurrent writers of one entry never share a temporary file.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(format!(".{}.{n}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Compiles with shaderc: compute stage, Vulkan 1.2 target, optimized for performance.
fn compile(source: &str, name: &str) -> Result<Vec<u32>, VulkanError> {
    let failed = |log: String| VulkanError::Compile {
        name: name.to_string(),
        log,
    };
    let compiler = shaderc::Compiler::new().map_err(|e| failed(format!("shaderc: {e}")))?;
    let mut options =
        shaderc::CompileOptions::new().map_err(|e| failed(format!("shaderc options: {e}")))?;
    options.set_target_env(
        shaderc::TargetEnv::Vulkan,
        shaderc::EnvVersion::Vulkan1_2 as u32,
    );
    options.set_optimization_level(shaderc::OptimizationLevel::Performance);
    let artifact = compiler
        .compile_into_spirv(
            source,
            shaderc::ShaderKind::Compute,
            name,
            "main",
            Some(&options),
        )
        .map_err(|e| failed(e.to_string()))?;
    if artifact.get_num_warnings() > 0 {
        tracing::debug!("GLSL shader `{name}`: {}", artifact.get_warning_messages());
    }
    Ok(artifact.as_binary().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n";

    #[test]
    fn vulkan_spirv_cache_dir_follows_the_environment() {
        fn env(pairs: &'static [(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
            |name| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        }
        let all = env(&[
            ("AUBIER_SPIRV_CACHE", "/x/spv"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(cache_dir_from(all), Some(PathBuf::from("/x/spv")));
        let xdg = env(&[
            ("AUBIER_SPIRV_CACHE", ""),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/h"),
        ]);
        assert_eq!(
            cache_dir_from(xdg),
            Some(PathBuf::from("/xdg/aubier/spirv"))
        );
        let relative_xdg = env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]);
        assert_eq!(
            cache_dir_from(relative_xdg),
            Some(PathBuf::from("/h/.cache/aubier/spirv"))
        );
        assert_eq!(cache_dir_from(env(&[])), None);
    }

    #[test]
    fn vulkan_spirv_cache_hits_and_recompiles_corrupt_entries() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = cache_file(dir.path(), TINY);
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(name.len(), 16 + ".spv".len(), "{name}");
        assert!(u64::from_str_radix(&name[..16], 16).is_ok(), "{name}");

        let compiled = compile_glsl_in(TINY, "tiny", Some(dir.path())).expect("compiles");
        assert!(is_spirv(&compiled));
        assert_eq!(read_words(&file).unwrap(), Some(compiled.clone()));

        // A hit returns the entry as it is: another valid module planted under this key comes
        // back instead of a compile.
        let other = compile_glsl_in(
            "#version 450\nlayout(local_size_x = 2) in;\nvoid main() {}\n",
            "other",
            None,
        )
        .expect("compiles");
        assert_ne!(other, compiled);
        write_words(&file, &other).unwrap();
        assert_eq!(
            compile_glsl_in(TINY, "tiny", Some(dir.path())).unwrap(),
            other
        );

        // Corrupt entries are recompiled and replaced: a length that is not whole words, a
        // missing magic number, a file shorter than the header.
        let mut bad_magic: Vec<u8> = compiled.iter().flat_map(|w| w.to_le_bytes()).collect();
        bad_magic[0] ^= 0xff;
        let garbage: [&[u8]; 3] = [
            &[0x03, 0x02, 0x23, 0x07, 0x00],
            &bad_magic,
            &[0x03, 0x02, 0x23, 0x07],
        ];
        for bytes in garbage {
            std::fs::write(&file, bytes).unwrap();
            assert_eq!(read_words(&file).unwrap(), None);
            assert_eq!(
                compile_glsl_in(TINY, "tiny", Some(dir.path())).unwrap(),
                compiled
            );
            assert_eq!(read_words(&file).unwrap(), Some(compiled.clone()));
        }
    }

    #[test]
    fn vulkan_glsl_errors_carry_the_compiler_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bad = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() { undeclared = 1; }\n";
        let e = compile_glsl_in(bad, "broken.comp", Some(dir.path())).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, VulkanError::Compile { .. }), "{text}");
        assert!(text.contains("broken.comp"), "{text}");
        assert!(text.contains("undeclared"), "{text}");
        assert!(!cache_file(dir.path(), bad).exists());
    }
}
