//! GGUF files (llama.cpp's format): the metadata that gives a config, and tensors read with
//! candle's reader (`candle_core::quantized::gguf_file`, bounds-checked against the file)
//! and dequantized to f32 at load. Where a GGUF file is: [`locate`].

#[allow(unused_imports)]
use super::*;
use candle_core::quantized::{gguf_file, GgmlDType};

/// The tensor types fpt dequantizes (candle's CPU dequantization covers them).
pub const SUPPORTED: &[GgmlDType] = &[
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8K,
];

/// An open GGUF file: its header (metadata and tensor table), read once.
pub struct GgufFile {
    path: PathBuf,
    content: gguf_file::Content,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgufFile({})", self.path.display())
    }
}

impl GgufFile {
    /// Reads the header of `path` (candle's reader checks every count and length against
    /// the file's size before it allocates).
    pub fn open(path: &Path) -> Result<Self> {
        let mut f = std::fs::File::open(path).map_err(|source| BackboneError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = gguf_file::Content::read(&mut f).map_err(|e| BackboneError::Config {
            path: path.to_path_buf(),
            msg: format!("not a readable GGUF file: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn bad(&self, msg: String) -> BackboneError {
        BackboneError::Config {
            path: self.path.clone(),
            msg,
        }
    }

    /// `general.architecture` (`llama`, ...).
    pub fn architecture(&self) -> Option<&str> {
        match self.content.metadata.get("general.architecture") {
            Some(gguf_file::Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer field, `None` when absent.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        use gguf_file::Value as V;
        let v = match self.content.metadata.get(key) {
            None => return Ok(None),
            Some(v) => v,
        };
        let n: i128 = match v {
            V::U8(x) => *x as i128,
            V::I8(x) => *x as i128,
            V::U16(x) => *x as i128,
            V::I16(x) => *x as i128,
            V::U32(x) => *x as i128,
            V::I32(x) => *x as i128,
            V::U64(x) => *x as i128,
            V::I64(x) => *x as i128,
            other => return Err(self.bad(format!("metadata `{key}` is {other:?}, not an integer"))),
        };
        usize::try_from(n)
            .map(Some)
            .map_err(|_| self.bad(format!("metadata `{key}` is {n}, not a size")))
    }

    /// A number field, `None` when absent.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        use gguf_file::Value as V;
        Ok(match self.content.metadata.get(key) {
            None => None,
            Some(V::F32(x)) => Some(*x as f64),
            Some(V::F64(x)) => Some(*x),
            Some(_) => self.usize(key)?.map(|n| n as f64),
        })
    }

    /// A required integer field.
    pub fn need(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| self.bad(format!("missing metadata `{key}`")))
    }

    /// The shape of tensor `name` as stored (`[out, in]` for a matrix), if present.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.content.tensor_infos.get(name).map(|t| t.shape.dims().to_vec())
    }

    /// Every tensor's name.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.content.tensor_infos.keys().map(String::as_str)
    }

    /// Tensor `name` dequantized to f32, checked to have `shape` before its data is read
    /// (so what is allocated is bounded by the config, itself within fpt's limits).
    pub fn tensor(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| self.bad(format!("missing tensor `{name}`")))?;
        if info.shape.dims() != shape {
            return Err(BackboneError::Shape {
                path: self.path.clone(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                found: info.shape.dims().to_vec(),
            });
        }
        if !SUPPORTED.contains(&info.ggml_dtype) {
            return Err(self.bad(format!(
                "tensor `{name}` has type {:?}, which fpt does not dequantize (supported: {})",
                info.ggml_dtype,
                SUPPORTED
                    .iter()
                    .map(|t| format!("{t:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut f = std::fs::File::open(&self.path).map_err(|source| BackboneError::Io {
            path: self.path.clone(),
            source,
        })?;
        let q = info
            .read(&mut f, self.content.tensor_data_offset, &Device::Cpu)
            .map_err(|e| self.bad(format!("tensor `{name}`: {e}")))?;
        let t = q
            .dequantize(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|e| self.bad(format!("tensor `{name}` ({:?}): {e}", info.ggml_dtype)))?;
        Ok(t.to_device(device)?)
    }

    /// The type a tensor is stored in (for reports: "Q4_1 dequantized to f32").
    pub fn dtype(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|t| t.ggml_dtype)
    }
}

/// The GGUF file a backbone source names, if it names one: a `.gguf` file, a directory
/// holding exactly one `.gguf` and no `config.json`, or a built-in GGUF name (`smollm2`,
/// installed by `fpt fetch smollm2`; an error says how to get it when it is not there).
pub fn locate(source: &str) -> Result<Option<PathBuf>> {
    let p = Path::new(source);
    if p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return Ok(Some(p.to_path_buf()));
    }
    if p.is_dir() && !p.join("config.json").exists() {
        let found: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|source| BackboneError::Io {
                path: p.to_path_buf(),
                source,
            })?
            .flatten()
            .map(|e| e.path())
            .filter(|f| f.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
            .collect();
        return match found.len() {
            0 => Ok(None),
            1 => Ok(found.into_iter().next()),
            n => Err(BackboneError::Config {
                path: p.to_path_buf(),
                msg: format!("holds {n} .gguf files; name the one to load"),
            }),
        };
    }
    if source == "smollm2" {
        return hub::smollm2_gguf().map(Some);
    }
    // The full id loads the installed GGUF when there is one, else whatever the Hub cache
    // holds under that id.
    if hub::canonical(source) == hub::SMOLLM2_ID {
        return Ok(hub::smollm2_gguf().ok());
    }
    Ok(None)
}

/// How an architecture reads GGUF files ([`Registration::gguf`]).
#[derive(Debug, Clone, Copy)]
pub struct GgufReader {
    /// The `general.architecture` values it reads.
    pub architectures: &'static [&'static str],
    /// The config from the file's metadata.
    pub config: fn(&GgufFile) -> Result<Config>,
}

/// The config of a GGUF file, from the registered architecture that reads its
/// `general.architecture`.
pub fn config(file: &GgufFile) -> Result<Config> {
    let arch = file.architecture().unwrap_or("(none)");
    let readers: Vec<GgufReader> = ARCHITECTURES.iter().filter_map(|r| r.gguf).collect();
    match readers.iter().find(|g| g.architectures.contains(&arch)) {
        Some(g) => (g.config)(file),
        None => Err(BackboneError::Config {
            path: file.path().to_path_buf(),
            msg: format!(
                "GGUF architecture `{arch}` is not supported (supported: {})",
                readers
                    .iter()
                    .flat_map(|g| g.architectures.iter().copied())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}
