//! Devices by name: `cpu`, `cuda`, `cuda:N`. The tests and `fpt selfcheck` take theirs from
//! `FPT_DEVICE` (default `cpu`), so the same golden, self-check and trajectory-parity tests
//! run unchanged on a GPU (`FPT_DEVICE=cuda:0` with a `--features cuda` build).

use candle_core::{Device, Result};

/// The device `name` names. A CUDA name in a build without the `cuda` feature, or without
/// a usable GPU, is an error that says which.
pub fn parse(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ordinal = match name.strip_prefix("cuda") {
                Some("") => 0,
                Some(rest) => rest.strip_prefix(':').and_then(|n| n.parse().ok()).ok_or_else(|| {
                    candle_core::Error::Msg(format!("bad device `{name}` (expected cpu, cuda or cuda:N)"))
                })?,
                None => {
                    return Err(candle_core::Error::Msg(format!(
                        "unknown device `{name}` (expected cpu, cuda or cuda:N)"
                    )))
                }
            };
            if !cfg!(feature = "cuda") {
                return Err(candle_core::Error::Msg(format!(
                    "device `{name}`: this build has no CUDA support (build with `--features cuda`, see docs/backbones.md, section GPU)"
                )));
            }
            Device::new_cuda(ordinal)
                .map_err(|e| candle_core::Error::Msg(format!("device `{name}`: CUDA could not start ({e})")))
        }
    }
}

/// The device `FPT_DEVICE` names (default `cpu`).
pub fn from_env() -> Result<Device> {
    match std::env::var("FPT_DEVICE") {
        Ok(v) if !v.is_empty() => parse(&v).map_err(|e| candle_core::Error::Msg(format!("FPT_DEVICE: {e}"))),
        _ => Ok(Device::Cpu),
    }
}

/// A short name for `device`: `cpu` or `cuda:N`.
pub fn name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_parse_or_say_what_is_wrong() {
        assert!(super::parse("cpu").unwrap().is_cpu());
        for bad in ["gpu", "cuda:x", "cuda:"] {
            assert!(super::parse(bad).is_err(), "{bad}");
        }
        if !cfg!(feature = "cuda") {
            let e = super::parse("cuda:0").unwrap_err().to_string();
            assert!(e.contains("--features cuda"), "{e}");
        }
    }
}
