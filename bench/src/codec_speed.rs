//! Measures, on this machine and in one run, what every shard write and read pays: BLAKE3 (the
//! shard block checksum) against CRC32C, and Reed–Solomon encode and reconstruct through
//! `cairn_common::codec` for the default 4+2 layout. Prints GB/s; run with
//! `cargo run --release -p cairn-bench --bin codec-speed`.

use std::time::Instant;

use cairn_common::codec::Codec;

const MIB: usize = 1 << 20;

fn rate(bytes: usize, f: impl Fn()) -> f64 {
    f();
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed().as_secs_f64() < 1.0 {
        f();
        rounds += 1;
    }
    (bytes * rounds) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let data: Vec<u8> = (0..MIB).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let blocks = |hash: &dyn Fn(&[u8])| data.chunks(64 << 10).for_each(hash);
    println!("checksum over 1 MiB in 64 KiB blocks, one thread:");
    println!(
        "  blake3  {:6.2} GB/s",
        rate(MIB, || blocks(&|b| {
            std::hint::black_box(blake3::hash(b));
        }))
    );
    println!(
        "  crc32c  {:6.2} GB/s",
        rate(MIB, || blocks(&|b| {
            std::hint::black_box(crc32c::crc32c(b));
        }))
    );

    let (k, m) = (4usize, 2usize);
    let codec = Codec::new(k as u32, m as u32);
    let shards: Vec<Vec<u8>> =
        (0..k).map(|i| data.iter().map(|b| b.wrapping_add(i as u8)).collect()).collect();
    let parity = codec.encode(&shards).expect("encode");
    println!("Reed-Solomon {k}+{m}, 1 MiB shards, one thread (GB/s of stripe data):");
    println!(
        "  encode                 {:6.2}",
        rate(k * MIB, || drop(codec.encode(&shards).expect("encode")))
    );
    let all: Vec<Vec<u8>> = shards.iter().chain(parity.iter()).cloned().collect();
    let lose = |lost: &[usize]| {
        rate(k * MIB, || {
            let mut s: Vec<Option<Vec<u8>>> =
                all.iter().enumerate().map(|(i, d)| (!lost.contains(&i)).then(|| d.clone())).collect();
            codec.reconstruct_data(&mut s).expect("reconstruct");
        })
    };
    println!("  copy of present shards {:6.2}", lose(&[]));
    println!("  rebuild 1 data shard   {:6.2}", lose(&[1]));
    println!("  rebuild 2 data shards  {:6.2}", lose(&[0, 3]));
}
