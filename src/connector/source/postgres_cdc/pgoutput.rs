//! PostgreSQL's logical replication stream, as its `pgoutput` plugin writes it (protocol
//! version 1): the replication protocol's CopyData messages (`XLogData`, keepalives) and the
//! logical messages inside them (`Begin`, `Relation`, `Insert`, `Update`, `Delete`,
//! `Truncate`, `Commit`, and `Message` for `pg_logical_emit_message`). Decoding only: every
//! length is checked against what the message holds, and a message that does not read is an
//! error, never a panic.

use crate::error::{Error, ErrorKind, Result};

/// A log sequence number: a position in PostgreSQL's write-ahead log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl std::fmt::Display for Lsn {
    /// PostgreSQL's `X/Y` form.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl std::str::FromStr for Lsn {
    type Err = Error;

    fn from_str(s: &str) -> Result<Lsn> {
        let bad = || {
            Error::new(
                ErrorKind::InvalidText,
                format!("invalid input syntax for type pg_lsn: \"{s}\""),
            )
        };
        let (hi, lo) = s.split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

/// A message of the replication stream (the contents of a CopyData message).
#[derive(Debug, PartialEq)]
pub enum Replication<'a> {
    /// WAL data from `start`: one logical message.
    XLogData { start: Lsn, data: &'a [u8] },
    /// The server's keepalive: the end of its WAL, and whether it wants a status update now.
    Keepalive { end: Lsn, reply: bool },
}

/// A column of a relation as the stream describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RelationColumn {
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
    /// Part of the replica identity (the primary key, by default).
    pub key: bool,
}

/// A relation as the stream describes it, before the first change to it in a session and
/// after every change of its definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `d` default (the primary key), `n` nothing, `f` full, `i` an index.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// One column's value in a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    Null,
    /// A TOASTed value that did not change (an update leaves it out).
    Unchanged,
    /// The value's text (PostgreSQL's output function).
    Text(&'a [u8]),
}

/// The old row of an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Old<'a> {
    /// `K`: the key changed; the key's columns, the others null.
    Key(Vec<Value<'a>>),
    /// `O`: the whole row (`REPLICA IDENTITY FULL`), TOASTed values in full.
    Row(Vec<Value<'a>>),
}

impl<'a> Old<'a> {
    pub fn values(&self) -> &[Value<'a>] {
        match self {
            Old::Key(v) | Old::Row(v) => v,
        }
    }
}

/// A logical message of `pgoutput`.
#[derive(Debug, PartialEq)]
pub enum Logical<'a> {
    Begin {
        /// The transaction's commit LSN.
        final_lsn: Lsn,
        xid: u32,
    },
    Commit {
        /// The commit record's LSN, and the end of the transaction in the WAL.
        lsn: Lsn,
        end: Lsn,
    },
    Relation(Relation),
    Insert {
        relation: u32,
        new: Vec<Value<'a>>,
    },
    Update {
        relation: u32,
        /// The old row, when the stream carries it.
        old: Option<Old<'a>>,
        new: Vec<Value<'a>>,
    },
    Delete {
        relation: u32,
        /// The old row's key, or whole row.
        old: Vec<Value<'a>>,
    },
    Truncate {
        relations: Vec<u32>,
    },
    /// `pg_logical_emit_message`: how the snapshot marks its chunks' bounds in the stream.
    Message {
        transactional: bool,
        lsn: Lsn,
        prefix: String,
        content: &'a [u8],
    },
    /// Origins and types: not needed (types are known by their OIDs).
    Other(u8),
}

/// A cursor over a message's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn bad(&self) -> Error {
        Error::new(
            ErrorKind::ProtocolViolation,
            format!(
                "a {} message of the replication stream is cut short",
                self.what
            ),
        )
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() < n {
            return Err(self.bad());
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> Result<i16> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(self.i32()? as u32)
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn lsn(&mut self) -> Result<Lsn> {
        self.u64().map(Lsn)
    }

    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| self.bad())?;
        let s = String::from_utf8_lossy(&self.bytes[..end]).into_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(s)
    }

    fn tuple(&mut self) -> Result<Vec<Value<'a>>> {
        let n = self.i16()?;
        let n = usize::try_from(n).map_err(|_| self.bad())?;
        // Each column takes a byte at least: a count beyond the bytes left is a lie.
        if n > self.bytes.len() {
            return Err(self.bad());
        }
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' | b'b' => {
                    let len = usize::try_from(self.i32()?).map_err(|_| self.bad())?;
                    Value::Text(self.take(len)?)
                }
                other => {
                    return Err(Error::new(
                        ErrorKind::ProtocolViolation,
                        format!("unknown tuple column kind {:?}", other as char),
                    ))
                }
            });
        }
        Ok(values)
    }
}

/// Reads a CopyData message of the replication stream.
pub fn replication(bytes: &[u8]) -> Result<Replication<'_>> {
    let mut r = Reader {
        bytes,
        what: "replication",
    };
    match r.u8()? {
        b'w' => {
            let start = r.lsn()?;
            let _end = r.lsn()?;
            let _time = r.u64()?;
            Ok(Replication::XLogData {
                start,
                data: r.bytes,
            })
        }
        b'k' => {
            let end = r.lsn()?;
            let _time = r.u64()?;
            let reply = r.u8()? == 1;
            Ok(Replication::Keepalive { end, reply })
        }
        other => Err(Error::new(
            ErrorKind::ProtocolViolation,
            format!("unknown replication message {:?}", other as char),
        )),
    }
}

/// Reads a logical message of `pgoutput`.
pub fn logical(bytes: &[u8]) -> Result<Logical<'_>> {
    let mut r = Reader {
        bytes,
        what: "pgoutput",
    };
    let tag = r.u8()?;
    Ok(match tag {
        b'B' => {
            let final_lsn = r.lsn()?;
            let _time = r.u64()?;
            let xid = r.u32()?;
            Logical::Begin { final_lsn, xid }
        }
        b'C' => {
            let _flags = r.u8()?;
            let lsn = r.lsn()?;
            let end = r.lsn()?;
            let _time = r.u64()?;
            Logical::Commit { lsn, end }
        }
        b'R' => {
            let oid = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let replica_identity = r.u8()?;
            let n = usize::try_from(r.i16()?).map_err(|_| r.bad())?;
            if n > r.bytes.len() {
                return Err(r.bad());
            }
            let mut columns = Vec::with_capacity(n);
            for _ in 0..n {
                let flags = r.u8()?;
                let name = r.string()?;
                let type_oid = r.u32()?;
                let type_modifier = r.i32()?;
                columns.push(RelationColumn {
                    name,
                    type_oid,
                    type_modifier,
                    key: flags & 1 == 1,
                });
            }
            Logical::Relation(Relation {
                oid,
                namespace,
                name,
                replica_identity,
                columns,
            })
        }
        b'I' => {
            let relation = r.u32()?;
            if r.u8()? != b'N' {
                return Err(r.bad());
            }
            Logical::Insert {
                relation,
                new: r.tuple()?,
            }
        }
        b'U' => {
            let relation = r.u32()?;
            let mut kind = r.u8()?;
            let mut old = None;
            if kind == b'K' || kind == b'O' {
                let values = r.tuple()?;
                old = Some(if kind == b'K' {
                    Old::Key(values)
                } else {
                    Old::Row(values)
                });
                kind = r.u8()?;
            }
            if kind != b'N' {
                return Err(r.bad());
            }
            Logical::Update {
                relation,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let relation = r.u32()?;
            let kind = r.u8()?;
            if kind != b'K' && kind != b'O' {
                return Err(r.bad());
            }
            Logical::Delete {
                relation,
                old: r.tuple()?,
            }
        }
        b'T' => {
            let n = usize::try_from(r.i32()?).map_err(|_| r.bad())?;
            let _options = r.u8()?;
            if n > r.bytes.len() / 4 {
                return Err(r.bad());
            }
            let mut relations = Vec::with_capacity(n);
            for _ in 0..n {
                relations.push(r.u32()?);
            }
            Logical::Truncate { relations }
        }
        b'M' => {
            let flags = r.u8()?;
            let lsn = r.lsn()?;
            let prefix = r.string()?;
            let len = usize::try_from(r.i32()?).map_err(|_| r.bad())?;
            Logical::Message {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
                content: r.take(len)?,
            }
        }
        other => Logical::Other(other),
    })
}

/// A standby status update: the WAL written, flushed and applied up to `lsn` (Weir reports
/// the LSN of its newest durable checkpoint for all three), at `now_us` (microseconds since
/// the Unix epoch).
pub fn status_update(lsn: Lsn, now_us: i64) -> Vec<u8> {
    // PostgreSQL's epoch is 2000-01-01.
    const PG_EPOCH_US: i64 = 946_684_800_000_000;
    let mut out = Vec::with_capacity(34);
    out.push(b'r');
    for _ in 0..3 {
        out.extend_from_slice(&lsn.0.to_be_bytes());
    }
    out.extend_from_slice(&(now_us - PG_EPOCH_US).to_be_bytes());
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_read_and_print_as_postgresql_writes_them() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("16B374D848".parse::<Lsn>().is_err());
    }

    #[test]
    fn changes_and_relations_decode_and_short_messages_are_errors() {
        let mut relation = vec![b'R'];
        relation.extend_from_slice(&16385u32.to_be_bytes());
        relation.extend_from_slice(b"public\0orders\0d");
        relation.extend_from_slice(&2i16.to_be_bytes());
        relation.extend_from_slice(b"\x01id\0");
        relation.extend_from_slice(&23u32.to_be_bytes());
        relation.extend_from_slice(&(-1i32).to_be_bytes());
        relation.extend_from_slice(b"\x00note\0");
        relation.extend_from_slice(&25u32.to_be_bytes());
        relation.extend_from_slice(&(-1i32).to_be_bytes());
        let Logical::Relation(r) = logical(&relation).unwrap() else {
            panic!()
        };
        assert_eq!(
            (r.namespace.as_str(), r.name.as_str()),
            ("public", "orders")
        );
        assert!(r.columns[0].key && !r.columns[1].key);
        assert_eq!(r.columns[1].type_oid, 25);

        let mut update = vec![b'U'];
        update.extend_from_slice(&16385u32.to_be_bytes());
        update.extend_from_slice(b"K");
        update.extend_from_slice(&2i16.to_be_bytes());
        update.extend_from_slice(b"t\0\0\0\x017n");
        update.extend_from_slice(b"N");
        update.extend_from_slice(&2i16.to_be_bytes());
        update.extend_from_slice(b"t\0\0\0\x018u");
        assert_eq!(
            logical(&update).unwrap(),
            Logical::Update {
                relation: 16385,
                old: Some(Old::Key(vec![Value::Text(b"7"), Value::Null])),
                new: vec![Value::Text(b"8"), Value::Unchanged],
            }
        );
        let mut full = update.clone();
        full[5] = b'O';
        assert!(matches!(
            logical(&full).unwrap(),
            Logical::Update {
                old: Some(Old::Row(_)),
                ..
            }
        ));
        for cut in 0..update.len() - 1 {
            assert!(logical(&update[..cut]).is_err(), "{cut}");
        }
        // A column count or length beyond the message.
        let mut lying = vec![b'I'];
        lying.extend_from_slice(&1u32.to_be_bytes());
        lying.extend_from_slice(b"N");
        lying.extend_from_slice(&i16::MAX.to_be_bytes());
        assert!(logical(&lying).is_err());
        let mut long = vec![b'I'];
        long.extend_from_slice(&1u32.to_be_bytes());
        long.extend_from_slice(b"N\0\x01t");
        long.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(logical(&long).is_err());
    }

    #[test]
    fn keepalives_and_wal_data_are_told_apart() {
        let mut k = vec![b'k'];
        k.extend_from_slice(&0x10u64.to_be_bytes());
        k.extend_from_slice(&0u64.to_be_bytes());
        k.push(1);
        assert_eq!(
            replication(&k).unwrap(),
            Replication::Keepalive {
                end: Lsn(0x10),
                reply: true
            }
        );
        let mut w = vec![b'w'];
        w.extend_from_slice(&0x20u64.to_be_bytes());
        w.extend_from_slice(&0x30u64.to_be_bytes());
        w.extend_from_slice(&0u64.to_be_bytes());
        w.extend_from_slice(b"B");
        assert_eq!(
            replication(&w).unwrap(),
            Replication::XLogData {
                start: Lsn(0x20),
                data: b"B"
            }
        );
        assert_eq!(status_update(Lsn(5), 946_684_800_000_000).len(), 34);
    }
}
