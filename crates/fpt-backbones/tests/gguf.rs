//! GGUF files that are wrong in one way each: every error names the file and what is wrong
//! (the field, the tensor and its type or shape), and nothing is built.

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use fpt_backbones::{gguf, load};
use fpt_spec::{BackboneSpec, Init, TrainGroups};
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/llama-gguf-tiny/model.gguf")
}

fn spec(path: &Path) -> BackboneSpec {
    BackboneSpec {
        source: path.display().to_string(),
        init: Init::Pretrained,
        shape: Default::default(),
        residual_init: Default::default(),
        depth: None,
        final_norm: true,
        bit_pretrain: None,
        precision: Default::default(),
    }
}

fn load_err(path: &Path) -> String {
    match load(&spec(path), &TrainGroups::fpt(), &Device::Cpu, &mut fpt_nn::Rng::new(0)) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

type Meta = Vec<(String, gguf_file::Value)>;
type Tensors = Vec<(String, QTensor)>;

/// A one-block llama GGUF whose metadata and tensors `edit` may change.
fn write(path: &Path, edit: impl FnOnce(&mut Meta, &mut Tensors)) {
    use gguf_file::Value as V;
    let mut meta: Meta = vec![
        ("general.architecture".into(), V::String("llama".into())),
        ("llama.block_count".into(), V::U32(1)),
        ("llama.embedding_length".into(), V::U32(8)),
        ("llama.feed_forward_length".into(), V::U32(16)),
        ("llama.attention.head_count".into(), V::U32(2)),
        ("llama.attention.head_count_kv".into(), V::U32(1)),
        ("llama.rope.freq_base".into(), V::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon".into(), V::F32(1e-5)),
    ];
    let t = |shape: &[usize]| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.1).collect();
        QTensor::quantize(&Tensor::from_vec(v, shape, &Device::Cpu).unwrap(), GgmlDType::F32).unwrap()
    };
    let mut tensors: Tensors = vec![
        ("token_embd.weight".into(), t(&[10, 8])),
        ("blk.0.attn_norm.weight".into(), t(&[8])),
        ("blk.0.attn_q.weight".into(), t(&[8, 8])),
        ("blk.0.attn_k.weight".into(), t(&[4, 8])),
        ("blk.0.attn_v.weight".into(), t(&[4, 8])),
        ("blk.0.attn_output.weight".into(), t(&[8, 8])),
        ("blk.0.ffn_norm.weight".into(), t(&[8])),
        ("blk.0.ffn_gate.weight".into(), t(&[16, 8])),
        ("blk.0.ffn_up.weight".into(), t(&[16, 8])),
        ("blk.0.ffn_down.weight".into(), t(&[8, 16])),
        ("output_norm.weight".into(), t(&[8])),
    ];
    edit(&mut meta, &mut tensors);
    let meta: Vec<(&str, &V)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta, &tensors).unwrap();
}

#[test]
fn a_well_formed_file_loads_and_its_config_comes_from_the_metadata() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("ok.gguf");
    write(&p, |_, _| {});
    let m = load(&spec(&p), &TrainGroups::fpt(), &Device::Cpu, &mut fpt_nn::Rng::new(0)).unwrap();
    assert_eq!((m.architecture(), m.num_layers(), m.hidden_size()), ("llama", 1, 8));
    assert!(
        m.origin().contains("F32 x 11") && m.origin().contains("dequantized to f32"),
        "{}",
        m.origin()
    );
    // A directory holding one .gguf (and no config.json) names it too.
    let m = load(
        &spec(d.path()),
        &TrainGroups::fpt(),
        &Device::Cpu,
        &mut fpt_nn::Rng::new(0),
    )
    .unwrap();
    assert_eq!(m.num_layers(), 1);
}

#[test]
fn every_bad_file_is_named_with_what_is_wrong() {
    let d = tempfile::tempdir().unwrap();
    let case = |name: &str, edit: &dyn Fn(&mut Meta, &mut Tensors)| {
        let p = d.path().join(name);
        write(&p, edit);
        let e = load_err(&p);
        assert!(e.contains(name), "{e}");
        e
    };
    let e = case("arch.gguf", &|m, _| m[0].1 = gguf_file::Value::String("mamba".into()));
    assert!(e.contains("`mamba` is not supported (supported: llama)"), "{e}");
    let e = case("nolayers.gguf", &|m, _| m.retain(|(k, _)| k != "llama.block_count"));
    assert!(e.contains("missing metadata `llama.block_count`"), "{e}");
    let e = case("strlayers.gguf", &|m, _| {
        m[1].1 = gguf_file::Value::String("one".into())
    });
    assert!(e.contains("`llama.block_count`") && e.contains("not an integer"), "{e}");
    let e = case("heads.gguf", &|m, _| m[4].1 = gguf_file::Value::U32(3));
    assert!(e.contains("num_attention_heads"), "{e}");
    let e = case("missing.gguf", &|_, t| t.retain(|(n, _)| n != "blk.0.ffn_up.weight"));
    assert!(e.contains("missing tensor `blk.0.ffn_up.weight`"), "{e}");
    let e = case("shape.gguf", &|_, t| {
        let bad = QTensor::quantize(
            &Tensor::zeros((8, 4), candle_core::DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap();
        t.iter_mut().find(|(n, _)| n == "blk.0.attn_k.weight").unwrap().1 = bad;
    });
    assert!(
        e.contains("blk.0.attn_k.weight") && e.contains("[4, 8]") && e.contains("[8, 4]"),
        "{e}"
    );

    // Not GGUF at all, and a real file cut short: named, nothing loaded.
    let p = d.path().join("text.gguf");
    std::fs::write(&p, "hello").unwrap();
    let e = load_err(&p);
    assert!(e.contains("text.gguf") && e.contains("not a readable GGUF file"), "{e}");
    let bytes = std::fs::read(fixture()).unwrap();
    for cut in [20, bytes.len() / 3, bytes.len() - 100] {
        let p = d.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = load_err(&p);
        assert!(e.contains(&format!("cut{cut}.gguf")), "{e}");
    }
}

#[test]
fn a_tensor_type_fpt_does_not_dequantize_is_named_with_its_type() {
    // The fixture's first query matrix is Q8_0 (type 8); stored as Q8_1 (type 9), which
    // candle knows but fpt does not dequantize.
    let mut bytes = std::fs::read(fixture()).unwrap();
    let name = b"blk.0.attn_q.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the tensor's header entry");
    let dims_at = at + name.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    let type_at = dims_at + 4 + 8 * n_dims;
    assert_eq!(u32::from_le_bytes(bytes[type_at..type_at + 4].try_into().unwrap()), 8);
    bytes[type_at..type_at + 4].copy_from_slice(&9u32.to_le_bytes());
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("q81.gguf");
    std::fs::write(&p, &bytes).unwrap();
    let e = load_err(&p);
    assert!(
        e.contains("`blk.0.attn_q.weight` has type Q8_1") && e.contains("q81.gguf"),
        "{e}"
    );
    // The header is read alone without trouble.
    let f = gguf::GgufFile::open(&p).unwrap();
    assert_eq!(f.architecture(), Some("llama"));
}
