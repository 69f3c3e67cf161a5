//! The Raft log entry on disk, format 1 (`docs/ARCHITECTURE.md`, "Metadata replication"):
//! format byte, term, leader node and index (u64 big-endian), a payload tag (0 blank, 1
//! effects, 2 membership), then for effects the op count (u32) and per op its kind (1 put, 2
//! delete), its column family by name (length u8, bytes), key (length u32, bytes) and, for a
//! put, value (length u32, bytes); for membership, openraft's `Membership` as JSON. Anything
//! else — another format, an unknown tag, kind or family, a short or overlong entry — is an
//! error, never a guess.

use openraft::{CommittedLeaderId, EntryPayload};

use super::{Command, Entry, LogId};
use crate::store::{Cf, Op};

const FORMAT: u8 = 1;
const BLANK: u8 = 0;
const EFFECTS: u8 = 1;
const MEMBERSHIP: u8 = 2;
const PUT: u8 = 1;
const DELETE: u8 = 2;

/// Encode `entry` in format 1.
pub fn encode(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT);
    put_log_id(&mut out, &entry.log_id);
    match &entry.payload {
        EntryPayload::Blank => out.push(BLANK),
        EntryPayload::Normal(command) => {
            out.push(EFFECTS);
            out.extend_from_slice(&(command.ops.len() as u32).to_be_bytes());
            for op in &command.ops {
                match op {
                    Op::Put { cf, key, value } => {
                        out.push(PUT);
                        put_cf(&mut out, *cf);
                        put_bytes(&mut out, key);
                        put_bytes(&mut out, value);
                    }
                    Op::Delete { cf, key } => {
                        out.push(DELETE);
                        put_cf(&mut out, *cf);
                        put_bytes(&mut out, key);
                    }
                }
            }
        }
        EntryPayload::Membership(membership) => {
            out.push(MEMBERSHIP);
            // A membership of ids and addresses always serializes.
            out.extend_from_slice(&serde_json::to_vec(membership).expect("membership serializes"));
        }
    }
    out
}

/// Decode an entry written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<Entry, String> {
    let mut r = Reader { bytes, at: 0 };
    let format = r.u8()?;
    if format != FORMAT {
        return Err(format!("log entry format {format} (this build reads format {FORMAT})"));
    }
    let log_id = r.log_id()?;
    let payload = match r.u8()? {
        BLANK => EntryPayload::Blank,
        EFFECTS => {
            let count = r.u32()? as usize;
            // Every op takes at least 10 bytes: a count larger than what is left is corrupt.
            if count > r.left() / 10 {
                return Err(format!("log entry claims {count} ops in {} bytes", r.left()));
            }
            let mut ops = Vec::with_capacity(count);
            for _ in 0..count {
                let kind = r.u8()?;
                let cf = r.cf()?;
                let key = r.bytes()?.to_vec();
                ops.push(match kind {
                    PUT => Op::Put { cf, key, value: r.bytes()?.to_vec() },
                    DELETE => Op::Delete { cf, key },
                    other => return Err(format!("log entry op kind {other}")),
                });
            }
            EntryPayload::Normal(Command { ops })
        }
        MEMBERSHIP => {
            let rest = r.take(r.left())?;
            EntryPayload::Membership(
                serde_json::from_slice(rest).map_err(|e| format!("log entry membership: {e}"))?,
            )
        }
        other => return Err(format!("log entry payload tag {other}")),
    };
    if r.left() != 0 {
        return Err(format!("{} bytes after the log entry", r.left()));
    }
    Ok(Entry { log_id, payload })
}

/// The log id alone, without decoding the payload.
pub fn decode_log_id(bytes: &[u8]) -> Result<LogId, String> {
    let mut r = Reader { bytes, at: 0 };
    match r.u8()? {
        FORMAT => r.log_id(),
        other => Err(format!("log entry format {other} (this build reads format {FORMAT})")),
    }
}

fn put_log_id(out: &mut Vec<u8>, id: &LogId) {
    out.extend_from_slice(&id.leader_id.term.to_be_bytes());
    out.extend_from_slice(&id.leader_id.node_id.to_be_bytes());
    out.extend_from_slice(&id.index.to_be_bytes());
}

fn put_cf(out: &mut Vec<u8>, cf: Cf) {
    let name = cf.name().as_bytes();
    out.push(name.len() as u8);
    out.extend_from_slice(name);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.left() {
            return Err(format!(
                "log entry truncated: {n} bytes wanted at offset {}, {} left",
                self.at,
                self.left()
            ));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    fn log_id(&mut self) -> Result<LogId, String> {
        let (term, node, index) = (self.u64()?, self.u64()?, self.u64()?);
        Ok(LogId::new(CommittedLeaderId::new(term, node), index))
    }

    fn cf(&mut self) -> Result<Cf, String> {
        let len = self.u8()? as usize;
        let name = self.take(len)?;
        let name =
            std::str::from_utf8(name).map_err(|_| "log entry column family is not UTF-8".to_string())?;
        Cf::named(name).ok_or_else(|| format!("log entry names an unknown column family {name:?}"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::BasicNode;

    use super::*;
    use crate::raft::Membership;

    fn id(term: u64, node: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn effects() -> Entry {
        let ops = vec![
            Op::Put { cf: Cf::Inodes, key: b"\0\0\0\0\0\0\0\x02".to_vec(), value: vec![1, 2, 3] },
            Op::Delete { cf: Cf::Dentries, key: b"parent/name".to_vec() },
            Op::Put { cf: Cf::Counters, key: Vec::new(), value: Vec::new() },
        ];
        Entry { log_id: id(7, 3, 1234), payload: EntryPayload::Normal(Command { ops }) }
    }

    #[test]
    fn every_payload_round_trips() {
        let nodes: BTreeMap<u64, BasicNode> =
            (1..=3).map(|n| (n, BasicNode::new(format!("10.0.0.{n}:7000")))).collect();
        let membership = Membership::new(vec![nodes.keys().copied().collect()], nodes);
        for entry in [
            Entry { log_id: id(1, 1, 1), payload: EntryPayload::Blank },
            effects(),
            Entry { log_id: id(u64::MAX, 2, u64::MAX - 1), payload: EntryPayload::Membership(membership) },
        ] {
            let bytes = encode(&entry);
            assert_eq!(decode(&bytes).unwrap(), entry);
            assert_eq!(decode_log_id(&bytes).unwrap(), entry.log_id);
        }
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let bytes = encode(&effects());
        assert_eq!(bytes[0], 1, "format");
        assert_eq!(&bytes[1..9], &7u64.to_be_bytes(), "term");
        assert_eq!(&bytes[9..17], &3u64.to_be_bytes(), "leader node");
        assert_eq!(&bytes[17..25], &1234u64.to_be_bytes(), "index");
        assert_eq!(bytes[25], 1, "effects");
        assert_eq!(&bytes[26..30], &3u32.to_be_bytes(), "op count");
        assert_eq!(bytes[30], 1, "put");
        assert_eq!(&bytes[31..38], b"\x06inodes", "family by name");
    }

    #[test]
    fn damaged_entries_are_errors() {
        let good = encode(&effects());
        // Every truncation fails cleanly.
        for len in 0..good.len() {
            assert!(decode(&good[..len]).is_err(), "a {len}-byte prefix decoded");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer).unwrap_err().contains("after the log entry"));
        let mut format = good.clone();
        format[0] = 2;
        assert!(decode(&format).unwrap_err().contains("format 2"));
        let mut tag = good.clone();
        tag[25] = 9;
        assert!(decode(&tag).unwrap_err().contains("payload tag 9"));
        let mut kind = good.clone();
        kind[30] = 7;
        assert!(decode(&kind).is_err());
        let mut family = good.clone();
        family[32] = b'x';
        assert!(decode(&family).unwrap_err().contains("unknown column family"));
        let mut count = good;
        count[26..30].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&count).unwrap_err().contains("claims"));
    }
}
