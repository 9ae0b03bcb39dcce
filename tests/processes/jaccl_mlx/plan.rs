//! The plans of the mixed JACCL jobs: the operations of a job's shape, every rank's inputs,
//! the device file, and what both kinds of rank agree on (MLX's dtype codes, the digest; who
//! sends first is `tests/common/jaccl_wires.rs`'s `sends_first`).

use crate::common::{jaccl_wires, mlx_model::Lane, values};

use std::path::{Path, PathBuf};

use nuvec_core::DType;
use nuvec_distributed::reduce::Reduction;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One operation of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// All-reduce of `n` elements.
    Reduce {
        op: Reduction,
        dtype: DType,
        n: usize,
    },
    /// All-gather of `n` bytes per rank.
    Gather { n: usize },
    /// Sum-scatter into shards of `n` elements.
    Scatter { dtype: DType, n: usize },
    /// Rank r sends `n` bytes to r + shift and receives from r − shift.
    SendRecv { shift: usize, n: usize },
}

/// MLX's `jaccl::Dtype` code of `dtype`.
pub(super) fn code(dtype: DType) -> usize {
    match Lane::of(dtype) {
        Lane::Bool => 0,
        Lane::I8 => 1,
        Lane::I16 => 2,
        Lane::I32 => 3,
        Lane::I64 => 4,
        Lane::U8 => 5,
        Lane::U16 => 6,
        Lane::U32 => 7,
        Lane::U64 => 8,
        Lane::F16 => 9,
        Lane::Bf16 => 10,
        Lane::F32 => 11,
        Lane::F64 => 12,
        Lane::C64 => 13,
    }
}

pub(super) fn from_code(code: usize) -> DType {
    *values::DTYPES
        .iter()
        .find(|&&d| self::code(d) == code)
        .expect("a dtype code")
}

impl Op {
    /// The plan line: `sum|max|min <dtype>`, `gather`, `scatter <dtype>`, `sendrecv <shift>`.
    pub(super) fn line(&self) -> String {
        match *self {
            Op::Reduce { op, dtype, .. } => {
                let name = match op {
                    Reduction::Sum => "sum",
                    Reduction::Max => "max",
                    Reduction::Min => "min",
                };
                format!("{name} {}", code(dtype))
            }
            Op::Gather { .. } => "gather".into(),
            Op::Scatter { dtype, .. } => format!("scatter {}", code(dtype)),
            Op::SendRecv { shift, .. } => format!("sendrecv {shift}"),
        }
    }

    pub(super) fn parse(line: &str, input_bytes: usize, ranks: usize) -> Op {
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> usize { words[i].parse().expect("a number in the plan") };
        match words[0] {
            "sum" | "max" | "min" => {
                let dtype = from_code(num(1));
                let op = match words[0] {
                    "sum" => Reduction::Sum,
                    "max" => Reduction::Max,
                    _ => Reduction::Min,
                };
                Op::Reduce {
                    op,
                    dtype,
                    n: input_bytes / dtype.size(),
                }
            }
            "gather" => Op::Gather { n: input_bytes },
            "scatter" => {
                let dtype = from_code(num(1));
                Op::Scatter {
                    dtype,
                    n: input_bytes / ranks / dtype.size(),
                }
            }
            "sendrecv" => Op::SendRecv {
                shift: num(1),
                n: input_bytes,
            },
            other => panic!("unknown plan operation {other}"),
        }
    }
}

/// A job's shape.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) ring: bool,
    pub(super) ranks: usize,
    pub(super) wires: usize,
    pub(super) large: bool,
}

impl Shape {
    pub(super) fn name(&self) -> String {
        format!(
            "{}{}x{}-{}",
            if self.ring { "ring" } else { "mesh" },
            self.ranks,
            self.wires,
            if self.large { "large" } else { "small" }
        )
    }

    /// The device file: a mesh's is the multi-wire tests' (`mesh_device_file`: entry `[i][j]`
    /// lists `rdma_en{w·(R−1) + k}`, k the index of j among i's peers); a ring's entry towards
    /// the right neighbour `rdma_en{w}`, towards the left one `rdma_en{C + w}` (with 2 ranks
    /// both neighbours are one entry); a string when there is one wire.
    pub(super) fn device_file(&self) -> String {
        let (r, c) = (self.ranks, self.wires);
        if !self.ring {
            return jaccl_wires::mesh_device_file(r, c);
        }
        let entry = |names: Vec<String>| -> serde_json::Value {
            if c == 1 {
                names[0].clone().into()
            } else {
                names.into()
            }
        };
        let rows: Vec<serde_json::Value> = (0..r)
            .map(|i| {
                let (left, right) = ((i + r - 1) % r, (i + 1) % r);
                (0..r)
                    .map(|j| {
                        if j == i {
                            serde_json::Value::Null
                        } else if j == right {
                            entry((0..c).map(|w| format!("rdma_en{w}")).collect())
                        } else if j == left {
                            entry((0..c).map(|w| format!("rdma_en{}", c + w)).collect())
                        } else {
                            serde_json::Value::Null
                        }
                    })
                    .collect::<Vec<_>>()
                    .into()
            })
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    /// The operations of the shape: every dtype's all-reduce on a size class that rotates
    /// with the dtype and the shape (below a frame, below 32 KiB, below 512 KiB, above), with
    /// the reduction rotating too; f32 all-reduces either side of 32 KiB and 512 KiB; uint8
    /// all-reduces either side of a frame (4 KiB, and 8 KiB for large frames); for the ring,
    /// E either side of 2·R·C; all-gathers and send/recv either side of a frame and of
    /// 512 KiB, and in every class; sum-scatters of shards of one element, below, at and above 64 KiB and above
    /// 512 KiB.
    pub(super) fn ops(&self) -> Vec<Op> {
        let (r, c) = (self.ranks, self.wires);
        let turn = r + c + usize::from(self.ring) + 2 * usize::from(self.large);
        let mut ops = Vec::new();
        for (i, &dtype) in values::DTYPES.iter().enumerate() {
            let s = dtype.size();
            let bytes = match (i + turn) % 4 {
                0 => 3000,
                1 => 20_000,
                2 => 200_000,
                _ => 512 * 1024 + 24,
            };
            ops.push(Op::Reduce {
                op: values::OPS[(i + turn) % 3],
                dtype,
                n: bytes / s + i % 3,
            });
        }
        for n in [8192, 8193, 131_071, 131_072] {
            ops.push(Op::Reduce {
                op: values::OPS[n % 3],
                dtype: DType::F32,
                n,
            });
        }
        for n in [4096, 4097, 8191, 8192] {
            ops.push(Op::Reduce {
                op: Reduction::Sum,
                dtype: DType::U8,
                n,
            });
        }
        if self.ring {
            for n in [2 * r * c - 1, 2 * r * c] {
                ops.push(Op::Reduce {
                    op: Reduction::Sum,
                    dtype: DType::F64,
                    n,
                });
            }
        }
        for n in [4096, 4097, 40_000, 512 * 1024 - 1, 512 * 1024 + 5] {
            ops.push(Op::Gather { n });
        }
        // Shards exactly at and just above 64 KiB (the ring's switch to every wire), above
        // 512 KiB (the mesh's), of one element, and small.
        let d = |k: usize| values::DTYPES[(turn + k) % 14];
        for (dtype, elements) in [
            (d(0), 65_536 / d(0).size()),
            (d(5), 65_536 / d(5).size() + 1),
            (d(9), (512 * 1024 + 8) / d(9).size() + 1),
            (DType::F64, 1),
            (d(3), 20_000 / d(3).size()),
        ] {
            ops.push(Op::Scatter { dtype, n: elements });
        }
        let shift = if self.ring { 1 } else { 1 + turn % (r - 1) };
        for n in [4096, 4097, 100_000, 512 * 1024 - 1, 512 * 1024 + 1] {
            ops.push(Op::SendRecv { shift, n });
        }
        ops
    }
}

/// Rank `rank`'s input of operation `i` of `op` in a job of `ranks` ranks.
pub(super) fn input(i: usize, rank: usize, ranks: usize, op: &Op) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(
        21 ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    match *op {
        Op::Reduce { dtype, n, .. } => {
            canonical(dtype, values::typed_values(&mut rng, dtype, n, 1.0 / 32.0))
        }
        Op::Scatter { dtype, n } => canonical(
            dtype,
            values::typed_values(&mut rng, dtype, n * ranks, 1.0 / 32.0),
        ),
        Op::Gather { n } | Op::SendRecv { n, .. } => {
            let mut b = vec![0u8; n];
            rng.fill_bytes(&mut b);
            b
        }
    }
}

/// `values` with every boolean made 0 or 1: a C++ `bool` holding another byte is undefined
/// behaviour, and MLX's arrays hold none (this crate's reading of any nonzero byte as true is
/// checked in simulation, `tests/sim/jaccl.rs`).
pub(super) fn canonical(dtype: DType, mut values: Vec<u8>) -> Vec<u8> {
    if dtype == DType::Bool {
        values.iter_mut().for_each(|b| *b = u8::from(*b != 0));
    }
    values
}

/// FNV-1a (64 bits) of a result, as the C++ ranks print it.
pub(super) fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A plan written to a directory: the operations and every rank's inputs.
pub(super) struct Plan {
    pub(super) dir: PathBuf,
    pub(super) ops: Vec<Op>,
    pub(super) inputs: Vec<Vec<Vec<u8>>>,
}

impl Plan {
    pub(super) fn write(dir: &Path, shape: &Shape, ops: Vec<Op>) -> Plan {
        std::fs::create_dir_all(dir).expect("create the plan's directory");
        let mut text = String::new();
        let mut inputs = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            text += &op.line();
            text.push('\n');
            let ins: Vec<Vec<u8>> = (0..shape.ranks)
                .map(|r| input(i, r, shape.ranks, op))
                .collect();
            for (r, bytes) in ins.iter().enumerate() {
                std::fs::write(dir.join(format!("in-{i}-{r}.bin")), bytes).expect("an input");
            }
            inputs.push(ins);
        }
        std::fs::write(dir.join("plan.txt"), text).expect("write the plan");
        Plan {
            dir: dir.to_owned(),
            ops,
            inputs,
        }
    }
}
