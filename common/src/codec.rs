//! Reed–Solomon erasure codec (systematic: data shards are stored as they are, `m` parity
//! shards are computed over them). Built on `reed-solomon-simd`: pure Rust, maintained, SIMD
//! on x86 and ARM. Its parity bytes are part of Cairn's on-disk format: changing the codec
//! library means a new shard format version.
//!
//! All shards handed to the codec have one length, which must be even; callers pad shorter
//! data shards with zeros (see `Layout::coded_len`).

use crate::content::ContentHashes;
use crate::{CairnError, Result};

#[derive(Clone, Copy, Debug)]
pub struct Codec {
    k: usize,
    m: usize,
}

impl Codec {
    pub fn new(k: u32, m: u32) -> Codec {
        Codec { k: k as usize, m: m as usize }
    }

    /// Compute the `m` parity shards of `data` (`k` shards of one even length).
    pub fn encode<T: AsRef<[u8]>>(&self, data: &[T]) -> Result<Vec<Vec<u8>>> {
        if data.len() != self.k {
            return Err(CairnError::internal(format!("encode: {} shards for k={}", data.len(), self.k)));
        }
        if self.m == 0 {
            return Ok(Vec::new());
        }
        reed_solomon_simd::encode(self.k, self.m, data.iter().map(|d| d.as_ref()))
            .map_err(|e| CairnError::internal(format!("encode: {e}")))
    }

    /// Fill in the missing data shards (indexes `0..k`) from any `k` present shards of the
    /// `k+m`. Present shards must all have the same even length. Parity shards stay as given.
    pub fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<()> {
        if shards.len() != self.k + self.m {
            return Err(CairnError::internal(format!(
                "reconstruct: {} shards for {}+{}",
                shards.len(),
                self.k,
                self.m
            )));
        }
        let present = shards.iter().filter(|s| s.is_some()).count();
        if present < self.k {
            return Err(CairnError::unavailable(format!(
                "only {present} of {} shards available, {} needed",
                self.k + self.m,
                self.k
            )));
        }
        if shards[..self.k].iter().all(|s| s.is_some()) {
            return Ok(());
        }
        let originals = shards[..self.k].iter().enumerate().filter_map(|(i, s)| s.as_deref().map(|d| (i, d)));
        let recovery = shards[self.k..].iter().enumerate().filter_map(|(i, s)| s.as_deref().map(|d| (i, d)));
        let restored = reed_solomon_simd::decode(self.k, self.m, originals, recovery)
            .map_err(|e| CairnError::corrupt(format!("reconstruct: {e}")))?;
        for (i, data) in restored {
            shards[i] = Some(data);
        }
        Ok(())
    }

    /// Fill in every missing shard, data and parity (used to rebuild a lost shard).
    pub fn reconstruct_all(&self, shards: &mut [Option<Vec<u8>>]) -> Result<()> {
        self.reconstruct_data(shards)?;
        if shards[self.k..].iter().any(|s| s.is_none()) {
            let data: Vec<&[u8]> = shards[..self.k].iter().map(|s| s.as_deref().unwrap_or(&[])).collect();
            let parity = self.encode(&data)?;
            for (i, p) in parity.into_iter().enumerate() {
                if shards[self.k + i].is_none() {
                    shards[self.k + i] = Some(p);
                }
            }
        }
        Ok(())
    }
}

/// The shards of one stripe version gathered for decoding. Data shards past the written length
/// are empty and known to be zeros, so they count as present without a fetch; every fetched
/// shard is checked against its stored length and zero-padded to the coded length.
pub struct StripeShards {
    layout: crate::Layout,
    written_len: u64,
    shards: Vec<Option<Vec<u8>>>,
    /// The data shards' content hashes (none: nothing is checked beyond lengths).
    hashes: ContentHashes,
    /// Data shards already checked against `hashes` (bit per index).
    checked: u32,
}

impl StripeShards {
    pub fn new(layout: crate::Layout, written_len: u64) -> StripeShards {
        let coded = layout.coded_len(written_len) as usize;
        let shards = (0..layout.width())
            .map(|i| (i < layout.k && layout.shard_len(i, written_len) == 0).then(|| vec![0; coded]))
            .collect();
        StripeShards { layout, written_len, shards, hashes: ContentHashes::default(), checked: 0 }
    }

    /// Check the data shards against their writer's content hashes: each one added, and each
    /// one decoded (so a wrong parity shard shows as decoded data that does not match).
    pub fn verified_by(mut self, hashes: ContentHashes) -> StripeShards {
        self.hashes = hashes;
        self
    }

    /// Whether shard `index` has to be fetched (it is not a known-empty data shard).
    pub fn needs_fetch(&self, index: u32) -> bool {
        !(index < self.layout.k && self.layout.shard_len(index, self.written_len) == 0)
    }

    /// Shards present (fetched, or known to be empty).
    pub fn present(&self) -> usize {
        self.shards.iter().filter(|s| s.is_some()).count()
    }

    /// Enough shards are present to decode.
    pub fn decodable(&self) -> bool {
        self.present() >= self.layout.k as usize
    }

    /// Add a fetched shard; a shard of the wrong length, or a data shard that does not match
    /// its content hash, is rejected (`Corrupt`, and not used).
    pub fn add(&mut self, index: u32, data: &[u8]) -> Result<()> {
        let expect = self.layout.shard_len(index, self.written_len) as usize;
        if data.len() != expect {
            return Err(CairnError::corrupt(format!(
                "shard {index} has {} bytes, expected {expect}",
                data.len()
            )));
        }
        self.hashes.check(index, data)?;
        self.checked |= 1 << index;
        let mut v = data.to_vec();
        v.resize(self.layout.coded_len(self.written_len) as usize, 0);
        self.shards[index as usize] = Some(v);
        Ok(())
    }

    /// After decoding: every data shard not checked when added matches its content hash.
    fn check_decoded(&self) -> Result<()> {
        for i in (0..self.layout.k).filter(|&i| self.checked & (1 << i) == 0 && self.hashes.covers(i)) {
            let len = self.layout.shard_len(i, self.written_len) as usize;
            let shard = &self.shards[i as usize].as_ref().expect("reconstructed")[..len];
            self.hashes.check(i, shard).map_err(|e| {
                CairnError::corrupt(format!(
                    "decoded from shards that do not agree with the writer's content hashes: {}",
                    e.message()
                ))
            })?;
        }
        Ok(())
    }

    /// The stripe's first `written_len` bytes, decoded from any `k` shards.
    pub fn data(mut self) -> Result<Vec<u8>> {
        Codec::new(self.layout.k, self.layout.m).reconstruct_data(&mut self.shards)?;
        self.check_decoded()?;
        let mut data = Vec::with_capacity(self.written_len as usize);
        for (i, shard) in self.shards.iter().take(self.layout.k as usize).enumerate() {
            let len = self.layout.shard_len(i as u32, self.written_len) as usize;
            data.extend_from_slice(&shard.as_ref().expect("reconstructed")[..len]);
        }
        Ok(data)
    }

    /// Shard `index` as stored, rebuilt from any `k` shards.
    pub fn shard(mut self, index: u32) -> Result<Vec<u8>> {
        Codec::new(self.layout.k, self.layout.m).reconstruct_all(&mut self.shards)?;
        self.check_decoded()?;
        let mut data = self.shards[index as usize].take().expect("reconstructed");
        data.truncate(self.layout.shard_len(index, self.written_len) as usize);
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_shards(k: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..k).map(|_| (0..len).map(|_| rng.gen()).collect()).collect()
    }

    /// Every pattern of up to m lost shards (data and parity) reconstructs byte-exact.
    #[test]
    fn every_loss_pattern_up_to_m_reconstructs() {
        for (k, m) in [(4usize, 2usize), (2, 1), (6, 3), (1, 2)] {
            let codec = Codec::new(k as u32, m as u32);
            let data = random_shards(k, 4098, (k * 10 + m) as u64);
            let parity = codec.encode(&data).unwrap();
            let all: Vec<Vec<u8>> = data.iter().chain(parity.iter()).cloned().collect();
            let n = k + m;
            for mask in 0u32..(1 << n) {
                if mask.count_ones() as usize > m {
                    continue;
                }
                let mut shards: Vec<Option<Vec<u8>>> = all
                    .iter()
                    .enumerate()
                    .map(|(i, s)| if mask & (1 << i) != 0 { None } else { Some(s.clone()) })
                    .collect();
                codec.reconstruct_all(&mut shards).unwrap();
                for i in 0..n {
                    assert_eq!(shards[i].as_ref().unwrap(), &all[i], "k={k} m={m} mask={mask:b} shard {i}");
                }
            }
        }
    }

    #[test]
    fn more_than_m_losses_is_an_error() {
        let codec = Codec::new(4, 2);
        let data = random_shards(4, 64, 1);
        let parity = codec.encode(&data).unwrap();
        let mut shards: Vec<Option<Vec<u8>>> =
            vec![None, None, None, Some(data[3].clone()), Some(parity[0].clone()), Some(parity[1].clone())];
        let err = codec.reconstruct_data(&mut shards).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unavailable);
    }

    #[test]
    fn stripe_shards_decode_a_short_stripe_from_parity() {
        let layout = crate::Layout::new(4, 2, 4096).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let written = data.len() as u64;
        let coded = layout.coded_len(written) as usize;
        let padded: Vec<Vec<u8>> = (0..4)
            .map(|i| {
                let mut v = data[(i * 4096).min(data.len())..((i + 1) * 4096).min(data.len())].to_vec();
                v.resize(coded, 0);
                v
            })
            .collect();
        let parity = Codec::new(4, 2).encode(&padded).unwrap();
        // Shards 2 and 3 are empty: only 0, 1 and the parity are stored.
        let mut s = StripeShards::new(layout, written);
        assert!(!s.needs_fetch(2) && !s.needs_fetch(3) && s.needs_fetch(0) && s.needs_fetch(5));
        assert!(s.add(1, &data[..10]).is_err(), "wrong length is rejected");
        s.add(1, &data[4096..]).unwrap();
        s.add(4, &parity[0]).unwrap();
        assert_eq!(s.data().unwrap(), data);
        let mut s = StripeShards::new(layout, written);
        s.add(4, &parity[0]).unwrap();
        s.add(5, &parity[1]).unwrap();
        assert_eq!(s.shard(0).unwrap(), data[..4096]);
    }

    /// With the writer's content hashes, a data shard that is not what was written is refused
    /// when added, and a parity shard that is not is caught in what it decodes to.
    #[test]
    fn stripe_shards_check_content_hashes() {
        let layout = crate::Layout::new(4, 2, 4096).unwrap();
        let data: Vec<u8> = (0..4 * 4096u32).map(|i| (i * 13 + 5) as u8).collect();
        let written = data.len() as u64;
        let shards: Vec<Vec<u8>> = data.chunks(4096).map(<[u8]>::to_vec).collect();
        let parity = Codec::new(4, 2).encode(&shards).unwrap();
        let hashes = ContentHashes::of(&shards);
        let mut forged = shards[2].clone();
        forged[100] ^= 1;

        let mut s = StripeShards::new(layout, written).verified_by(hashes.clone());
        let e = s.add(2, &forged).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt);
        assert_eq!(s.present(), 0, "a refused shard is not used");
        for i in [0, 1, 3] {
            s.add(i, &shards[i as usize]).unwrap();
        }
        s.add(4, &parity[0]).unwrap();
        assert_eq!(s.data().unwrap(), data);

        // A forged parity shard passes `add` (parity has no hash) but not the decode.
        let mut bad_parity = parity[1].clone();
        bad_parity[7] ^= 0x80;
        let mut s = StripeShards::new(layout, written).verified_by(hashes.clone());
        for i in [0, 1] {
            s.add(i, &shards[i as usize]).unwrap();
        }
        s.add(4, &parity[0]).unwrap();
        s.add(5, &bad_parity).unwrap();
        let e = s.data().unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        let mut s = StripeShards::new(layout, written).verified_by(hashes.clone());
        for i in [1, 2, 3] {
            s.add(i, &shards[i as usize]).unwrap();
        }
        s.add(5, &bad_parity).unwrap();
        assert_eq!(s.shard(4).unwrap_err().kind(), crate::ErrorKind::Corrupt, "a rebuild from it is refused");

        // Without hashes the same forged shard decodes to wrong bytes: what the hashes are for.
        let mut s = StripeShards::new(layout, written);
        for i in [0, 1] {
            s.add(i, &shards[i as usize]).unwrap();
        }
        s.add(4, &parity[0]).unwrap();
        s.add(5, &bad_parity).unwrap();
        assert_ne!(s.data().unwrap(), data);
    }

    #[test]
    fn zero_parity_is_plain_striping() {
        let codec = Codec::new(3, 0);
        assert!(codec.encode(&random_shards(3, 8, 2)).unwrap().is_empty());
    }
}
