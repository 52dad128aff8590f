//! The fixed-size descriptor MPI ranks exchange before every collective:
//! a [`Signature`] and the rank's role in it (or the goodbye a leaving rank
//! posts) encoded as seven `u64`s, so one `MPI_Iallgather` of 56 bytes per
//! rank tells every rank what all the others are about to do, and every
//! rank reaches the same verdict from the same array.

use crate::collective::{ReduceOp, Signature};
use crate::error::ParallelError;
use brasa_tensor::DType;

/// Words in a descriptor.
pub(crate) const WORDS: usize = 7;

/// First word of every descriptor: the protocol and its version. A peer
/// running an incompatible brasa-parallel shows up as a mismatch naming it
/// instead of as garbage read as sizes.
const MAGIC: u64 = 0x6272_6173_6101_0001; // "brasa", protocol 1.1

/// The operation names a descriptor can carry, in code order (code = index + 1).
const OPS: [&str; 6] = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "send/recv", "barrier"];
/// The code of a rank leaving the group (its communicator was dropped).
const LEAVE: u64 = 100;

const REDUCE_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// A rank's part in an operation: everyone does the same in a collective,
/// while a point-to-point transfer needs one sender and one receiver
/// ([`Signature`] calls both `send/recv`, so two ranks that both send agree
/// on it; the role tells them apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// A collective: all ranks alike.
    Collective,
    /// The sending side of a transfer.
    Sender,
    /// The receiving side of a transfer.
    Receiver,
}

impl Role {
    /// The role the peer must have.
    fn counterpart(self) -> Role {
        match self {
            Role::Collective => Role::Collective,
            Role::Sender => Role::Receiver,
            Role::Receiver => Role::Sender,
        }
    }
}

/// What one rank posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Posted {
    /// About to run this operation in this role.
    Op(Signature, Role),
    /// Leaving the group: its communicator was dropped.
    Leave,
}

impl std::fmt::Display for Posted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Posted::Op(signature, Role::Collective) => signature.fmt(f),
            Posted::Op(signature, Role::Sender) => write!(f, "{signature}, sending"),
            Posted::Op(signature, Role::Receiver) => write!(f, "{signature}, receiving"),
            Posted::Leave => f.write_str("left the group (its communicator was dropped)"),
        }
    }
}

/// Encodes what this rank posts.
pub(crate) fn encode(posted: &Posted) -> [u64; WORDS] {
    let (signature, role) = match posted {
        Posted::Leave => return [MAGIC, LEAVE, 0, 0, 0, 0, 0],
        Posted::Op(signature, role) => (signature, role),
    };
    let op = OPS.iter().position(|name| *name == signature.op).map_or(0, |i| i as u64 + 1);
    let dtype = signature.dtype.and_then(|d| DType::ALL.iter().position(|x| *x == d)).map_or(0, |i| i as u64 + 1);
    let reduce = signature.reduce.and_then(|r| REDUCE_OPS.iter().position(|x| *x == r)).map_or(0, |i| i as u64 + 1);
    let root = signature.root.map_or(0, |r| r as u64 + 1);
    let role = match role {
        Role::Collective => 0,
        Role::Sender => 1,
        Role::Receiver => 2,
    };
    [MAGIC, op, dtype, signature.numel as u64, reduce, root, role]
}

/// Decodes a peer's descriptor; an error says what was unreadable.
pub(crate) fn decode(words: &[u64]) -> Result<Posted, String> {
    let [magic, op, dtype, numel, reduce, root, role] = match words {
        [a, b, c, d, e, f, g] => [*a, *b, *c, *d, *e, *f, *g],
        _ => return Err(format!("a descriptor of {} words instead of {WORDS}", words.len())),
    };
    if magic != MAGIC {
        return Err(format!(
            "an incompatible collective protocol (descriptor tag {magic:#018x}, expected {MAGIC:#018x}: another \
             brasa-parallel version, or not brasa at all)"
        ));
    }
    if op == LEAVE {
        return Ok(Posted::Leave);
    }
    let pick = |code: u64, what: &str, len: usize| -> Result<Option<usize>, String> {
        match code {
            0 => Ok(None),
            c if (c as usize) <= len => Ok(Some(c as usize - 1)),
            c => Err(format!("an unknown {what} code {c}")),
        }
    };
    let op = match pick(op, "operation", OPS.len())? {
        Some(i) => OPS[i],
        None => return Err("a descriptor without an operation".into()),
    };
    let numel = usize::try_from(numel).map_err(|_| format!("an element count {numel} beyond this machine's usize"))?;
    let role = match role {
        0 => Role::Collective,
        1 => Role::Sender,
        2 => Role::Receiver,
        r => return Err(format!("an unknown role code {r}")),
    };
    let signature = Signature {
        op,
        dtype: pick(dtype, "dtype", DType::ALL.len())?.map(|i| DType::ALL[i]),
        numel,
        reduce: pick(reduce, "reduction", REDUCE_OPS.len())?.map(|i| REDUCE_OPS[i]),
        root: match root {
            0 => None,
            r => Some(usize::try_from(r - 1).map_err(|_| format!("a root {r} beyond this machine's usize"))?),
        },
    };
    Ok(Posted::Op(signature, role))
}

/// How a descriptor exchange went, from every rank's descriptors (`all`,
/// `WORDS` per rank in rank order).
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Every rank posted what this one did.
    Agreed,
    /// Ranks disagree, and all of them know it (they see the same array):
    /// nobody moves data, the group stays in step.
    Mismatch(ParallelError),
    /// A peer left the group: it will take part in nothing more.
    PeerLeft(ParallelError),
    /// A descriptor could not be read: what that peer does next is unknown.
    Unreadable(ParallelError),
}

/// Compares the peers' descriptors (`all`: each with the rank it came
/// from; this rank's own entry, if present, is skipped) with what matches
/// `ours`: the same for a collective, the counterpart for a transfer.
/// `op` names the operation in errors.
pub(crate) fn verdict(op: &'static str, rank: usize, ours: &Posted, all: &[(usize, [u64; WORDS])]) -> Verdict {
    let expected = match ours {
        Posted::Op(signature, role) => Posted::Op(*signature, role.counterpart()),
        Posted::Leave => Posted::Leave,
    };
    let mut first_mismatch = None;
    for (peer, words) in all.iter().filter(|(peer, _)| *peer != rank) {
        let theirs = match decode(words) {
            Ok(theirs) => theirs,
            Err(what) => {
                return Verdict::Unreadable(ParallelError::Mpi {
                    rank,
                    message: format!("{op}: rank {peer} sent {what}"),
                    code: None,
                })
            }
        };
        if theirs == expected {
            continue;
        }
        if theirs == Posted::Leave {
            return Verdict::PeerLeft(ParallelError::PeerFailed {
                op,
                rank,
                peer: *peer,
                reason: "left the group (its communicator was dropped: the rank returned, failed or panicked)".into(),
            });
        }
        first_mismatch.get_or_insert((*peer, theirs));
    }
    match first_mismatch {
        None => Verdict::Agreed,
        Some((peer, theirs)) => Verdict::Mismatch(ParallelError::Mismatch {
            op,
            rank,
            ours: ours.to_string(),
            peer,
            theirs: theirs.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signatures() -> Vec<Signature> {
        let mut out = Vec::new();
        for op in OPS {
            for dtype in [None, Some(DType::F32), Some(DType::BF16), Some(DType::Bool)] {
                for reduce in [None, Some(ReduceOp::Avg), Some(ReduceOp::Min)] {
                    for root in [None, Some(0), Some(7)] {
                        out.push(Signature { op, dtype, numel: 70_001, reduce, root });
                    }
                }
            }
        }
        out
    }

    #[test]
    fn every_signature_round_trips() {
        for signature in signatures() {
            for role in [Role::Collective, Role::Sender, Role::Receiver] {
                assert_eq!(decode(&encode(&Posted::Op(signature, role))), Ok(Posted::Op(signature, role)));
            }
        }
        assert_eq!(decode(&encode(&Posted::Leave)), Ok(Posted::Leave));
    }

    #[test]
    fn garbage_is_an_error_not_a_signature() {
        assert!(decode(&[0; WORDS]).unwrap_err().contains("incompatible"));
        assert!(decode(&[MAGIC, 99, 0, 0, 0, 0, 0]).unwrap_err().contains("operation code 99"));
        assert!(decode(&[MAGIC, 1, 42, 0, 0, 0, 0]).unwrap_err().contains("dtype code 42"));
        assert!(decode(&[MAGIC, 1, 1, 0, 0, 0, 3]).unwrap_err().contains("role code 3"));
        assert!(decode(&[MAGIC, 1]).unwrap_err().contains("2 words"));
    }

    #[test]
    fn verdicts_name_both_sides() {
        let signature = Signature { op: "all_reduce", dtype: Some(DType::F32), numel: 10, reduce: None, root: None };
        let ours = Posted::Op(signature, Role::Collective);
        let theirs = Posted::Op(Signature { numel: 12, ..signature }, Role::Collective);
        let all = [(0, encode(&ours)), (1, encode(&theirs))];
        match verdict("all_reduce", 0, &ours, &all) {
            Verdict::Mismatch(e) => {
                let ParallelError::Mismatch { op: "all_reduce", rank: 0, ours, peer: 1, theirs } = &e else {
                    panic!("{e:?}")
                };
                assert_eq!(
                    (ours.as_str(), theirs.as_str()),
                    ("all_reduce of 10 f32 elements", "all_reduce of 12 f32 elements")
                );
            }
            other => panic!("{other:?}"),
        }
        let all = [(0, encode(&ours)), (1, encode(&Posted::Leave))];
        assert!(matches!(
            verdict("all_reduce", 0, &ours, &all),
            Verdict::PeerLeft(ParallelError::PeerFailed { peer: 1, .. })
        ));
        let all = [(0, encode(&ours)), (1, encode(&ours))];
        assert!(matches!(verdict("all_reduce", 0, &ours, &all), Verdict::Agreed));
        let all = [(0, encode(&ours)), (1, [1; WORDS])];
        assert!(matches!(verdict("all_reduce", 0, &ours, &all), Verdict::Unreadable(_)));
    }

    #[test]
    fn transfers_need_a_sender_and_a_receiver() {
        let signature = Signature { op: "send/recv", dtype: Some(DType::U8), numel: 3, reduce: None, root: None };
        let send = Posted::Op(signature, Role::Sender);
        let recv = Posted::Op(signature, Role::Receiver);
        assert!(matches!(verdict("send", 0, &send, &[(1, encode(&recv))]), Verdict::Agreed));
        assert!(matches!(verdict("recv", 1, &recv, &[(0, encode(&send))]), Verdict::Agreed));
        match verdict("send", 0, &send, &[(1, encode(&send))]) {
            Verdict::Mismatch(e) => {
                let ParallelError::Mismatch { op: "send", rank: 0, ours, peer: 1, theirs } = &e else {
                    panic!("{e:?}")
                };
                assert_eq!(
                    (ours.as_str(), theirs.as_str()),
                    ("send/recv of 3 u8 elements, sending", "send/recv of 3 u8 elements, sending")
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
