//! Links the libraries that Debian's `libshaderc_combined.a` leaves out.
//!
//! The Vulkan device layer (`src/backend/vulkan/shader.rs`) compiles GLSL to SPIR-V in process
//! with the `shaderc` crate, linked statically (`prefer-static-linking`): the `aubier` binary then
//! needs no shaderc shared library at run time. `shaderc-sys` links `libshaderc_combined.a` from
//! `/usr/lib/<triple>-linux-gnu/`, which upstream builds bundle with glslang and SPIRV-Tools, but
//! Debian's (package `libshaderc-dev`) holds shaderc alone: its glslang and SPIRV-Tools symbols stay
//! undefined. They come from the static libraries of `glslang-dev` and `spirv-tools`, linked here
//! (glslang's before SPIRV-Tools', which they call), and from the C++ standard library
//! (dynamically: it is on every system). Install:
//! `apt-get install -y libshaderc-dev glslang-dev spirv-tools` (`.ci/run` does).

fn main() {
    for lib in [
        "glslang",
        "MachineIndependent",
        "GenericCodeGen",
        "OSDependent",
        "OGLCompiler",
        "SPIRV",
        "glslang-default-resource-limits",
        "SPIRV-Tools-opt",
        "SPIRV-Tools",
    ] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    println!("cargo:rustc-link-lib=dylib=stdc++");
    println!("cargo:rerun-if-changed=build.rs");
}
