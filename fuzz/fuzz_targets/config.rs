//! Server configs as files, `--set` flags and environment variables give them: parsing,
//! overriding and validation of both server configs must end in a config or a clear error,
//! never a panic.
//!
//! Input: text; its first line is the file, each later line a `key=value` override (odd
//! lines as environment variables, even ones as `--set`).
#![no_main]

use cairn_common::config::{load_with, ChunkConfig, MetaConfig, CHUNK_ENV_PREFIX, META_ENV_PREFIX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.split('\n');
    let file = lines.next().unwrap_or_default().replace('\u{1}', "\n");
    let mut env = Vec::new();
    let mut sets = Vec::new();
    for (i, line) in lines.enumerate() {
        if i % 2 == 0 {
            if let Some((k, v)) = line.split_once('=') {
                env.push((k.to_string(), v.to_string()));
            }
        } else {
            sets.push(line.to_string());
        }
    }
    if let Ok(meta) = toml::from_str::<MetaConfig>(&file) {
        let _ = meta.validate();
        let _ = meta.layout();
        let _ = meta.replica_addrs();
    }
    if let Ok(chunk) = toml::from_str::<ChunkConfig>(&file) {
        let _ = chunk.validate();
    }
    let meta_env = env.iter().map(|(k, v)| (format!("{META_ENV_PREFIX}{k}"), v.clone()));
    if let Ok(meta) = load_with::<MetaConfig>(None, META_ENV_PREFIX, meta_env, &sets) {
        let _ = meta.validate();
        let _ = meta.layout();
    }
    let chunk_env = env.iter().map(|(k, v)| (format!("{CHUNK_ENV_PREFIX}{k}"), v.clone()));
    if let Ok(chunk) = load_with::<ChunkConfig>(None, CHUNK_ENV_PREFIX, chunk_env, &sets) {
        let _ = chunk.validate();
    }
});
