//! The state of one group as stored in the `groups` table: its row count, one accumulator
//! per call, and the output row last emitted.

use datafusion::arrow::datatypes::i256;

use super::accumulator::Acc;
use crate::error::{Error, ErrorKind, Result};

#[derive(Debug, Clone, PartialEq)]
pub(super) struct GroupState {
    pub(super) rows: i64,
    pub(super) accs: Vec<Acc>,
    /// The output row last emitted for this group, so it can be retracted exactly.
    pub(super) emitted: Option<Vec<u8>>,
    /// Whether an aggregate of that row failed (out of range) and is NULL there: counted as
    /// one of the view's errors until the group's output no longer fails.
    pub(super) failed: bool,
}

pub(super) fn decode_i64(v: &[u8]) -> Result<i64> {
    let b: [u8; 8] = v.try_into().map_err(|_| corrupt())?;
    Ok(i64::from_le_bytes(b))
}

pub(super) fn corrupt() -> Error {
    Error::new(ErrorKind::DataCorruption, "bad aggregate state")
}

pub(super) fn encode_state(s: &GroupState) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + s.accs.len() * 25);
    out.extend_from_slice(&s.rows.to_le_bytes());
    out.push(u8::try_from(s.accs.len()).expect("at most 255 aggregates per group"));
    for acc in &s.accs {
        match acc {
            Acc::Count { n } => {
                out.push(0);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Acc::Exact { n, sum } => match sum.to_i128() {
                Some(small) => {
                    out.push(1);
                    out.extend_from_slice(&n.to_le_bytes());
                    out.extend_from_slice(&small.to_le_bytes());
                }
                // Only sums past 128 bits take the room of 256.
                None => {
                    out.push(6);
                    out.extend_from_slice(&n.to_le_bytes());
                    out.extend_from_slice(&sum.to_le_bytes());
                }
            },
            Acc::Float { n, sum } => {
                out.push(2);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&sum.to_le_bytes());
            }
            Acc::Extreme { n, best: None } => {
                out.push(3);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Acc::Extreme { n, best: Some(v) } => {
                out.push(5);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            Acc::Bools { n, trues } => {
                out.push(4);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&trues.to_le_bytes());
            }
        }
    }
    match &s.emitted {
        Some(row) => {
            out.push(if s.failed { 2 } else { 1 });
            out.extend_from_slice(row);
        }
        None => out.push(0),
    }
    out
}

pub(super) fn decode_state(bytes: &[u8]) -> Result<GroupState> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8]> {
            if self.0.len() < n {
                return Err(corrupt());
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Ok(a)
        }
        fn i64(&mut self) -> Result<i64> {
            Ok(i64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| corrupt())?,
            ))
        }
        fn u8(&mut self) -> Result<u8> {
            Ok(self.take(1)?[0])
        }
    }
    let mut r = Reader(bytes);
    let rows = r.i64()?;
    let count = r.u8()?;
    let mut accs = Vec::with_capacity(count as usize);
    for _ in 0..count {
        accs.push(match r.u8()? {
            0 => Acc::Count { n: r.i64()? },
            1 => Acc::Exact {
                n: r.i64()?,
                sum: i256::from(i128::from_le_bytes(
                    r.take(16)?.try_into().map_err(|_| corrupt())?,
                )),
            },
            6 => Acc::Exact {
                n: r.i64()?,
                sum: i256::from_le_bytes(r.take(32)?.try_into().map_err(|_| corrupt())?),
            },
            2 => Acc::Float {
                n: r.i64()?,
                sum: f64::from_le_bytes(r.take(8)?.try_into().map_err(|_| corrupt())?),
            },
            3 => Acc::Extreme {
                n: r.i64()?,
                best: None,
            },
            5 => {
                let n = r.i64()?;
                let len = u32::from_le_bytes(r.take(4)?.try_into().map_err(|_| corrupt())?);
                Acc::Extreme {
                    n,
                    best: Some(r.take(len as usize)?.to_vec()),
                }
            }
            4 => Acc::Bools {
                n: r.i64()?,
                trues: r.i64()?,
            },
            _ => return Err(corrupt()),
        });
    }
    let (emitted, failed) = match r.u8()? {
        0 => (None, false),
        1 => (Some(r.0.to_vec()), false),
        2 => (Some(r.0.to_vec()), true),
        _ => return Err(corrupt()),
    };
    Ok(GroupState {
        rows,
        accs,
        emitted,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let big = i256::from(i128::MAX).wrapping_mul(i256::from(-7));
        for (sum, failed) in [(i256::from(-5), false), (big, true)] {
            let s = GroupState {
                rows: 3,
                accs: vec![
                    Acc::Count { n: 3 },
                    Acc::Exact { n: 2, sum },
                    Acc::Float { n: 1, sum: 1.5 },
                    Acc::Extreme { n: 2, best: None },
                    Acc::Extreme {
                        n: 1,
                        best: Some(vec![7, 0, 1]),
                    },
                ],
                emitted: Some(vec![1, 2, 3]),
                failed,
            };
            assert_eq!(decode_state(&encode_state(&s)).unwrap(), s);
        }
        // A sum that fits in 128 bits keeps the 16 bytes it always had.
        let small = GroupState {
            rows: 1,
            accs: vec![Acc::Exact {
                n: 1,
                sum: i256::from(i128::MIN),
            }],
            emitted: None,
            failed: false,
        };
        assert_eq!(encode_state(&small).len(), 8 + 1 + 1 + 8 + 16 + 1);
    }
}
