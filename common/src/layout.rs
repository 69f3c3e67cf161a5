//! Stripe geometry. A file is a sequence of stripes of `k × unit` bytes; data shard `i` of a
//! stripe holds stripe bytes `[i·unit, (i+1)·unit)`, so a file smaller than one unit lives
//! entirely in data shard 0 and is read with one request to one chunkserver. Parity shards
//! are as long as the longest data shard, rounded up to an even length (the codec's rule);
//! shorter data shards are zero-padded for coding but stored at their real length.

use crate::{CairnError, Result};

/// Smallest and largest stripe unit accepted.
pub const MIN_UNIT: u32 = 4096;
pub const MAX_UNIT: u32 = 64 << 20;
/// Largest k and m accepted.
pub const MAX_K: u32 = 16;
pub const MAX_M: u32 = 8;

/// Erasure-coding layout of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub k: u32,
    pub m: u32,
    pub unit: u32,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { k: 4, m: 2, unit: 1 << 20 }
    }
}

/// One contiguous piece of a file range that lives in one shard of one stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub stripe: u64,
    pub shard: u32,
    /// Offset inside the shard's data.
    pub shard_offset: u64,
    pub len: u64,
    /// Offset of this piece inside the caller's buffer.
    pub buf_offset: u64,
}

impl Layout {
    pub fn new(k: u32, m: u32, unit: u32) -> Result<Layout> {
        let layout = Layout { k, m, unit };
        layout.validate()?;
        Ok(layout)
    }

    /// Parse `"4+2"` (unit defaults to 1 MiB); the one parser of `K+M` for every command.
    pub fn parse_ec(spec: &str) -> Result<Layout> {
        let (k, m) = spec
            .split_once('+')
            .ok_or_else(|| CairnError::invalid(format!("{spec:?} is not K+M, e.g. 4+2")))?;
        let k = k.trim().parse().map_err(|_| CairnError::invalid(format!("{spec:?}: K is not a number")))?;
        let m = m.trim().parse().map_err(|_| CairnError::invalid(format!("{spec:?}: M is not a number")))?;
        Layout::new(k, m, Layout::default().unit)
    }

    pub fn validate(&self) -> Result<()> {
        if self.k == 0 || self.k > MAX_K {
            return Err(CairnError::invalid(format!("k must be 1..={MAX_K}, got {}", self.k)));
        }
        if self.m > MAX_M {
            return Err(CairnError::invalid(format!("m must be 0..={MAX_M}, got {}", self.m)));
        }
        if self.unit < MIN_UNIT || self.unit > MAX_UNIT || !self.unit.is_multiple_of(MIN_UNIT) {
            return Err(CairnError::invalid(format!(
                "unit must be a multiple of {MIN_UNIT} between {MIN_UNIT} and {MAX_UNIT}, got {}",
                self.unit
            )));
        }
        Ok(())
    }

    pub fn width(&self) -> u32 {
        self.k + self.m
    }

    /// Bytes of file data in one full stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.k as u64 * self.unit as u64
    }

    pub fn stripe_of(&self, offset: u64) -> u64 {
        offset / self.stripe_bytes()
    }

    pub fn stripe_start(&self, stripe: u64) -> u64 {
        stripe * self.stripe_bytes()
    }

    /// Number of stripes needed for `size` bytes.
    pub fn stripes_for(&self, size: u64) -> u64 {
        size.div_ceil(self.stripe_bytes())
    }

    /// Stored length of shard `index` of a stripe whose first `written_len` bytes were encoded.
    pub fn shard_len(&self, index: u32, written_len: u64) -> u64 {
        if index < self.k {
            written_len.saturating_sub(index as u64 * self.unit as u64).min(self.unit as u64)
        } else {
            self.coded_len(written_len)
        }
    }

    /// Length every shard is padded to for coding: the longest data shard, rounded up to even.
    pub fn coded_len(&self, written_len: u64) -> u64 {
        let longest = written_len.min(self.unit as u64);
        longest + (longest & 1)
    }

    /// Split `len` bytes at file `offset` into per-shard segments, in file order.
    pub fn segments(&self, offset: u64, len: u64) -> Vec<Segment> {
        let unit = self.unit as u64;
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let stripe = self.stripe_of(pos);
            let in_stripe = pos - self.stripe_start(stripe);
            let shard = (in_stripe / unit) as u32;
            let shard_offset = in_stripe % unit;
            let take = (unit - shard_offset).min(end - pos);
            out.push(Segment { stripe, shard, shard_offset, len: take, buf_offset: pos - offset });
            pos += take;
        }
        out
    }

    /// The chunkserver position (index into the placement group) of shard `index` of `stripe`:
    /// the group rotated left by the stripe number.
    pub fn position(&self, stripe: u64, index: u32) -> usize {
        ((stripe + index as u64) % self.width() as u64) as usize
    }
}

impl From<Layout> for cairn_proto::Layout {
    fn from(l: Layout) -> Self {
        cairn_proto::Layout { k: l.k, m: l.m, unit: l.unit }
    }
}

impl TryFrom<&cairn_proto::Layout> for Layout {
    type Error = CairnError;
    fn try_from(p: &cairn_proto::Layout) -> Result<Self> {
        Layout::new(p.k, p.m, p.unit)
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{} unit {} KiB", self.k, self.m, self.unit / 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: u32 = 1 << 20;

    fn l42() -> Layout {
        Layout::new(4, 2, UNIT).unwrap()
    }

    #[test]
    fn parse_and_validate() {
        assert_eq!(Layout::parse_ec("4+2").unwrap(), l42());
        assert_eq!(Layout::parse_ec(" 8 + 3 ").unwrap().m, 3);
        for bad in ["4", "0+2", "4+9", "x+1", "17+1"] {
            assert!(Layout::parse_ec(bad).is_err(), "{bad}");
        }
        assert!(Layout::new(4, 2, 1000).is_err());
        assert!(Layout::new(4, 2, 128 << 20).is_err());
    }

    #[test]
    fn shard_lengths_cover_written_bytes() {
        let l = l42();
        let u = UNIT as u64;
        for written in [0, 1, u - 1, u, u + 1, 3 * u + 7, 4 * u] {
            let data: u64 = (0..l.k).map(|i| l.shard_len(i, written)).sum();
            assert_eq!(data, written, "written {written}");
            let coded = l.coded_len(written);
            assert_eq!(coded % 2, 0);
            assert!(coded >= l.shard_len(0, written));
            assert_eq!(l.shard_len(4, written), coded);
        }
        assert_eq!(l.shard_len(0, 1), 1);
        assert_eq!(l.shard_len(1, 1), 0);
        assert_eq!(l.coded_len(1), 2);
    }

    #[test]
    fn segments_split_at_unit_and_stripe_edges() {
        let l = l42();
        let u = UNIT as u64;
        let segs = l.segments(u - 10, 4 * u + 20);
        assert_eq!(segs[0], Segment { stripe: 0, shard: 0, shard_offset: u - 10, len: 10, buf_offset: 0 });
        assert_eq!(segs[1].shard, 1);
        assert_eq!(segs[3].shard, 3);
        assert_eq!(segs[4], Segment { stripe: 1, shard: 0, shard_offset: 0, len: u, buf_offset: 3 * u + 10 });
        assert_eq!(segs.last().unwrap().len, 10);
        assert_eq!(segs.iter().map(|s| s.len).sum::<u64>(), 4 * u + 20);
        assert!(l.segments(5, 0).is_empty());
    }

    #[test]
    fn positions_rotate_and_stay_distinct() {
        let l = l42();
        for stripe in 0..10 {
            let mut seen: Vec<usize> = (0..6).map(|i| l.position(stripe, i)).collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 6);
        }
        assert_eq!(l.position(1, 0), 1);
        assert_eq!(l.position(1, 5), 0);
    }
}
