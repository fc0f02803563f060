//! What this build of hwqueue can run on: the compiled-in backends by
//! precedence, what each probe found, and which backend selection picks and
//! why. Run it first on a new machine: `cargo run --release --example info`.

use hwqueue::{Device, Policy, SPEC_NAMES, registry};

fn main() {
    println!(
        "hwqueue {}: compiled-in backends, highest precedence first",
        env!("CARGO_PKG_VERSION")
    );
    for report in registry().backends() {
        let role = match (report.dispatches, report.reference_oracle) {
            (true, true) => "reference oracle, the fallback",
            (true, false) => "dispatches",
            (false, _) => "does not dispatch",
        };
        println!(
            "\n  {} (precedence {}, {role})",
            report.id, report.precedence
        );
        match &report.probe {
            Ok(devices) if devices.is_empty() => println!("    probe: no device found"),
            Ok(devices) => {
                for device in devices {
                    let memory = device.memory.map_or("memory unknown".to_owned(), |m| {
                        format!("{:.1} GiB", m as f64 / (1u64 << 30) as f64)
                    });
                    let units = device
                        .compute_units
                        .map_or(String::new(), |u| format!(", {u} compute units"));
                    println!("    {}: {} ({memory}{units})", device.spec, device.name);
                }
            }
            Err(error) => println!("    probe: {error}"),
        }
    }

    #[cfg(feature = "vulkan")]
    vulkan_devices();

    let missing: Vec<_> = SPEC_NAMES
        .iter()
        .filter_map(|n| n.missing_feature.map(|f| (n.id, f)))
        .collect();
    if !missing.is_empty() {
        println!("\nnot compiled in:");
        for (id, feature) in &missing {
            println!("  {id}: rebuild with `--features {feature}` to include it");
        }
    }
    if missing.iter().any(|(id, _)| *id == "cuda") && missing.iter().any(|(id, _)| *id == "vulkan")
    {
        println!("\nno GPU backend in this build: work runs on the CPU.");
    }

    println!();
    match registry().select(Policy::default()) {
        Ok(selection) => {
            println!(
                "selected: {} ({})\n  because {}",
                selection.spec,
                selection.device.name(),
                selection.reason
            );
            let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
            match selection.device.memory_info() {
                Some(memory) => println!(
                    "  memory: {:.1} GiB free of {:.1} GiB",
                    gib(memory.free),
                    gib(memory.total)
                ),
                None => println!("  memory: free and total unknown"),
            }
        }
        Err(error) => println!("selected: nothing: {error}"),
    }
    match hwqueue::registry::preferred::<hwqueue::AnyBackend>(Policy::no_fallback()) {
        Ok(entry) => println!("without the CPU fallback: {}", entry.id),
        Err(error) => println!("without the CPU fallback: {error}"),
    }
}

/// Every Vulkan device, usable or not, software ones included (which the
/// probe above leaves out: selection never picks one).
#[cfg(feature = "vulkan")]
fn vulkan_devices() {
    println!("\nVulkan devices (software ones open by spec, never by selection):");
    match hwqueue::vulkan::devices() {
        Ok(devices) if devices.is_empty() => println!("  none"),
        Ok(devices) => {
            for device in devices {
                println!("  {}: {} ({})", device.spec, device.name, device.kind);
                println!(
                    "    driver {}, Vulkan {}",
                    device.driver, device.api_version
                );
                for (bytes, local) in &device.heaps {
                    let kind = if *local { "device-local" } else { "host" };
                    println!(
                        "    heap: {:.1} GiB, {kind}",
                        *bytes as f64 / (1u64 << 30) as f64
                    );
                }
                for (flags, count) in &device.families {
                    println!("    queue family: {flags} x{count}");
                }
                if let Some(why) = &device.unusable {
                    println!("    not usable: {why}");
                }
            }
        }
        Err(error) => println!("  {error}"),
    }
}
