//! `aubier devices` end to end on the built binary: it lists lavapipe (CI installs it; a machine
//! without a Vulkan device fails here), and without a driver it exits 1 saying what to install.

use std::process::{Command, Output};

/// `aubier devices ARGS`; `no_driver` points the loader at a driver manifest that does not
/// exist, so that it loads no driver (its `vkCreateInstance` then returns
/// `VK_ERROR_INCOMPATIBLE_DRIVER`).
fn devices(args: &[&str], no_driver: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aubier"));
    cmd.arg("devices").args(args);
    if no_driver {
        // VK_DRIVER_FILES is the newer name of VK_ICD_FILENAMES and wins over it when set.
        cmd.env("VK_ICD_FILENAMES", "/nonexistent")
            .env("VK_DRIVER_FILES", "/nonexistent")
            .env_remove("VK_ADD_DRIVER_FILES");
    }
    cmd.output().expect("runs aubier")
}

#[test]
fn devices_json_lists_lavapipe() {
    let o = devices(&["--json"], false);
    assert!(
        o.status.success(),
        "aubier devices --json failed (CI installs lavapipe: mesa-vulkan-drivers libvulkan1): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON array");
    let list = v.as_array().expect("a JSON array");
    assert!(!list.is_empty());
    for (i, d) in list.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert!(d["subgroup_size"].as_u64().unwrap() >= 1, "{d}");
        assert!(
            d["limits"]["max_storage_buffer_range"].as_u64().unwrap() > 0,
            "{d}"
        );
        assert!(d["heaps"].as_array().is_some_and(|h| !h.is_empty()), "{d}");
    }
    let lavapipe = list
        .iter()
        .find(|d| d["name"].as_str().is_some_and(|n| n.contains("llvmpipe")))
        .unwrap_or_else(|| panic!("no llvmpipe in {v:#}"));
    assert_eq!(lavapipe["device_type"], "cpu");
    assert_eq!(lavapipe["features"]["buffer_device_address"], true);
    assert_eq!(lavapipe["features"]["storage_buffer_8bit_access"], true);
    let ops = lavapipe["subgroup_operations"].as_array().unwrap();
    assert!(ops.iter().any(|o| o == "arithmetic"), "{ops:?}");
}

#[test]
fn devices_text_shows_limits_and_features() {
    let o = devices(&[], false);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.starts_with("device 0: "), "{text}");
    for needle in [
        "llvmpipe",
        "cpu (software)",
        "subgroup ",
        "maxStorageBufferRange",
        "workgroup ",
        "bufferDeviceAddress yes",
        "VK_EXT_external_memory_host",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

#[test]
fn devices_without_a_driver_exit_1_saying_what_to_install() {
    for args in [&[][..], &["--json"][..]] {
        let o = devices(args, true);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
        assert!(err.contains("aubier devices: no Vulkan device"), "{err}");
        assert!(err.contains("VK_ERROR_INCOMPATIBLE_DRIVER"), "{err}");
        assert!(
            err.contains("apt-get install -y libvulkan1 mesa-vulkan-drivers"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
