//! A real PyTorch `DataLoader` (2 worker processes, Pillow decoding) reads a generated training
//! dataset from a Cairn mount: ImageNet-like JPEG files, WebDataset-style tar shards, TFRecord
//! files and unet3d-like .npz volumes (bench/ml/gen.py writes them through the mount). Every
//! sample must arrive exactly once with the bytes the generator hashed; a byte changed through the
//! mount must make the loader fail.
//!
//! Python comes from `$CAIRN_ML_PYTHON`, else `target/ml-venv` (made by `bench/ml/venv.sh
//! target/ml-venv torch`, which scripts/test.sh runs). Without it the test is skipped, except in CI
//! (`CI` set), where that is a failure.

mod support;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use support::Cluster;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn python() -> Option<PathBuf> {
    let python = std::env::var_os("CAIRN_ML_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/ml-venv/bin/python"));
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing: run bench/ml/venv.sh target/ml-venv torch (scripts/test.sh does)",
        python.display()
    );
    eprintln!("skipped: {} is missing (bench/ml/venv.sh target/ml-venv torch)", python.display());
    None
}

fn run(python: &Path, args: &[&str]) -> Output {
    Command::new(python)
        .args(args)
        .current_dir(repo().join("bench/ml"))
        .stdin(Stdio::null())
        .output()
        .expect("spawn python")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn pytorch_dataloader_reads_every_sample_of_every_format_intact() {
    let Some(python) = python() else { return };
    let cluster = Cluster::start(6, "4+2", 64);
    let root = cluster.mnt.join("dataset");
    let root_str = root.to_str().expect("utf8");
    let gen = run(
        &python,
        &[
            "gen.py",
            root_str,
            "--images",
            "240",
            "--classes",
            "6",
            "--per-shard",
            "64",
            "--npz",
            "6",
            "--npz-side",
            "40",
        ],
    );
    assert!(gen.status.success(), "gen.py failed:\n{}", text(&gen));

    for format in ["imagenet", "wds", "tfrecord", "npz"] {
        let batch = if format == "npz" { "2" } else { "16" };
        let out = run(
            &python,
            &[
                "torch_loader.py",
                root_str,
                "--format",
                format,
                "--workers",
                "2",
                "--batch",
                batch,
                "--epochs",
                "2",
            ],
        );
        let printed = text(&out);
        assert!(out.status.success(), "DataLoader over {format} failed:\n{printed}");
        let verified = printed.lines().filter(|l| l.contains("every sample verified")).count();
        assert_eq!(verified, 2, "{format}: expected two verified epochs:\n{printed}");
    }

    // The check is real: one byte changed inside a JPEG (through the mount) fails the epoch.
    let victim = std::fs::read_dir(root.join("imagenet/class-002"))
        .expect("class dir")
        .next()
        .expect("a file")
        .expect("entry")
        .path();
    let file = OpenOptions::new().write(true).open(&victim).expect("open victim");
    file.write_all_at(b"\x00\x01\x02\x03", 5000).expect("overwrite");
    drop(file);
    let out = run(
        &python,
        &["torch_loader.py", root_str, "--format", "imagenet", "--workers", "2", "--epochs", "1"],
    );
    let printed = text(&out);
    assert!(!out.status.success(), "a changed sample went unnoticed:\n{printed}");
    let key = victim.file_stem().expect("stem").to_string_lossy().into_owned();
    assert!(printed.contains(&format!("sample {key} differs")), "unexpected failure:\n{printed}");
}
