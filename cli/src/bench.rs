//! `cairn bench PATH`: a quick benchmark of a mounted directory through the ordinary file API
//! (what a training job sees), in the spirit of `juicefs bench`: big files written and read
//! sequentially, many small files written, read and stat'ed, each by `threads` threads at once.
//! Before every read phase the page cache of the files is dropped (`posix_fadvise DONTNEED`,
//! and `/proc/sys/vm/drop_caches` as root), so reads reach the filesystem. It works on any
//! directory: run it on a local disk for a baseline.

use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_common::{CairnError, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::admin::human;

#[derive(clap::Args)]
pub struct Options {
    path: PathBuf,
    /// Size of each thread's big file (0: skip).
    #[arg(long, value_parser = parse_size_or_zero, default_value = "256M")]
    big_file_size: u64,
    /// I/O size for the big files.
    #[arg(long, value_parser = crate::up::parse_size, default_value = "1M")]
    block_size: u64,
    /// Size of each small file.
    #[arg(long, value_parser = parse_size_or_zero, default_value = "128K")]
    small_file_size: u64,
    /// Small files per thread (0: skip).
    #[arg(long, default_value_t = 100)]
    small_files: u64,
    #[arg(long, short = 'p', default_value_t = 4)]
    threads: u64,
    /// Leave the files behind (in PATH/__cairn_bench_PID).
    #[arg(long)]
    keep: bool,
    #[arg(long)]
    json: bool,
}

/// A size (see [`crate::up::parse_size`]) where 0 means "skip".
fn parse_size_or_zero(text: &str) -> std::result::Result<u64, String> {
    if text.trim() == "0" {
        Ok(0)
    } else {
        crate::up::parse_size(text)
    }
}

/// One phase's outcome.
struct Phase {
    name: &'static str,
    ops: u64,
    bytes: u64,
    secs: f64,
    threads: u64,
}

impl Phase {
    /// Average latency of one operation as a thread saw it.
    fn ms_per_op(&self) -> f64 {
        self.secs * 1000.0 * self.threads as f64 / self.ops.max(1) as f64
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "phase": self.name, "ops": self.ops, "bytes": self.bytes, "seconds": self.secs,
            "ops_per_sec": self.ops as f64 / self.secs, "bytes_per_sec": self.bytes as f64 / self.secs,
            "ms_per_op": self.ms_per_op(),
        })
    }
}

pub fn run(opts: Options) -> Result<()> {
    if opts.threads == 0 || opts.block_size == 0 {
        return Err(CairnError::invalid("--threads and --block-size must be more than 0"));
    }
    if !opts.path.is_dir() {
        return Err(CairnError::invalid(format!("{} is not a directory", opts.path.display())));
    }
    let root = opts.path.join(format!("__cairn_bench_{}", std::process::id()));
    std::fs::create_dir(&root).map_err(|e| CairnError::from_io(&format!("mkdir {}", root.display()), &e))?;
    let result = phases(&opts, &root);
    if !opts.keep {
        if let Err(e) = std::fs::remove_dir_all(&root) {
            eprintln!("cairn: could not remove {}: {e}", root.display());
        }
    }
    let phases = result?;
    if opts.json {
        let v = json!({
            "path": opts.path, "threads": opts.threads, "big_file_size": opts.big_file_size,
            "block_size": opts.block_size, "small_file_size": opts.small_file_size,
            "small_files": opts.small_files,
            "phases": phases.iter().map(Phase::json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        println!(
            "{} threads; big files {} in {} blocks; small files {} x {} per thread",
            opts.threads,
            human(opts.big_file_size),
            human(opts.block_size),
            opts.small_files,
            human(opts.small_file_size)
        );
        println!("{:<18} {:>14} {:>12} {:>12}", "phase", "throughput", "ops/s", "ms/op");
        for p in &phases {
            let throughput = if p.bytes > 0 {
                format!("{}/s", human((p.bytes as f64 / p.secs) as u64))
            } else {
                "-".into()
            };
            println!(
                "{:<18} {:>14} {:>12.1} {:>12.3}",
                p.name,
                throughput,
                p.ops as f64 / p.secs,
                p.ms_per_op()
            );
        }
    }
    Ok(())
}

fn phases(opts: &Options, root: &Path) -> Result<Vec<Phase>> {
    let mut out = Vec::new();
    let big = |t: u64| root.join(format!("big.{t}"));
    let small_dir = |t: u64| root.join(format!("small.{t}"));
    let small = |t: u64, i: u64| small_dir(t).join(format!("f{i:06}"));
    let blocks = opts.big_file_size.div_ceil(opts.block_size);
    if opts.big_file_size > 0 {
        out.push(phase(opts, "write big file", blocks, |t, bar| {
            let mut f = std::fs::File::create(big(t)).map_err(io("create", &big(t)))?;
            let block = pattern(opts.block_size as usize, t);
            let mut left = opts.big_file_size;
            while left > 0 {
                let n = left.min(opts.block_size) as usize;
                f.write_all(&block[..n]).map_err(io("write", &big(t)))?;
                left -= n as u64;
                bar.inc(1);
            }
            f.sync_all().map_err(io("fsync", &big(t)))?;
            Ok(opts.big_file_size)
        })?);
        drop_caches((0..opts.threads).map(big));
        out.push(phase(opts, "read big file", blocks, |t, bar| {
            let mut f = std::fs::File::open(big(t)).map_err(io("open", &big(t)))?;
            let mut buf = vec![0u8; opts.block_size as usize];
            let mut total = 0;
            loop {
                let n = f.read(&mut buf).map_err(io("read", &big(t)))?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                bar.set_position(total / opts.block_size);
            }
            if total != opts.big_file_size {
                return Err(CairnError::corrupt(format!("{} read back {total} bytes", big(t).display())));
            }
            Ok(total)
        })?);
    }
    if opts.small_files > 0 {
        for t in 0..opts.threads {
            std::fs::create_dir_all(small_dir(t)).map_err(io("mkdir", &small_dir(t)))?;
        }
        out.push(phase(opts, "write small files", opts.small_files, |t, bar| {
            let data = pattern(opts.small_file_size as usize, t);
            for i in 0..opts.small_files {
                let mut f = std::fs::File::create(small(t, i)).map_err(io("create", &small(t, i)))?;
                f.write_all(&data).map_err(io("write", &small(t, i)))?;
                drop(f);
                bar.inc(1);
            }
            Ok(opts.small_files * opts.small_file_size)
        })?);
        drop_caches((0..opts.threads).flat_map(|t| (0..opts.small_files).map(move |i| small(t, i))));
        out.push(phase(opts, "read small files", opts.small_files, |t, bar| {
            let mut total = 0;
            for i in 0..opts.small_files {
                let data = std::fs::read(small(t, i)).map_err(io("read", &small(t, i)))?;
                if data.len() as u64 != opts.small_file_size {
                    return Err(CairnError::corrupt(format!(
                        "{} has {} bytes",
                        small(t, i).display(),
                        data.len()
                    )));
                }
                total += data.len() as u64;
                bar.inc(1);
            }
            Ok(total)
        })?);
        out.push(phase(opts, "stat files", opts.small_files, |t, bar| {
            for i in 0..opts.small_files {
                std::fs::metadata(small(t, i)).map_err(io("stat", &small(t, i)))?;
                bar.inc(1);
            }
            Ok(0)
        })?);
    }
    Ok(out)
}

/// Run `work(thread, bar)` on `opts.threads` threads at once; each does `per_thread` steps.
fn phase(
    opts: &Options,
    name: &'static str,
    per_thread: u64,
    work: impl Fn(u64, &ProgressBar) -> Result<u64> + Sync,
) -> Result<Phase> {
    let bar = if opts.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(per_thread * opts.threads), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template("{msg:18} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_message(name);
    let bytes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..opts.threads)
            .map(|t| {
                let (bar, bytes, work) = (&bar, bytes.clone(), &work);
                s.spawn(move || work(t, bar).map(|b| bytes.fetch_add(b, Ordering::Relaxed)))
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("bench thread panicked").map(|_| ()))
    })?;
    let secs = started.elapsed().max(Duration::from_micros(1)).as_secs_f64();
    bar.finish_and_clear();
    if !opts.json && bar.is_hidden() {
        eprintln!("{name}: done in {secs:.2}s");
    }
    Ok(Phase {
        name,
        ops: per_thread * opts.threads,
        bytes: bytes.load(Ordering::Relaxed),
        secs,
        threads: opts.threads,
    })
}

fn io(what: &'static str, path: &Path) -> impl Fn(std::io::Error) -> CairnError {
    let context = format!("{what} {}", path.display());
    move |e| CairnError::from_io(&context, &e)
}

/// Bytes that do not compress or dedupe trivially, different per thread.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Drop the page cache of `files` so the next reads reach the filesystem.
fn drop_caches(files: impl Iterator<Item = PathBuf>) {
    for f in files {
        if let Ok(file) = std::fs::File::open(&f) {
            // SAFETY: a valid open descriptor; advice only.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: sync(2) takes no arguments.
        unsafe { libc::sync() };
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    }
}
