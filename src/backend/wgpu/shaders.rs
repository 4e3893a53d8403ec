//! WGSL sources and the kernel table. Every op shader is written once against `real`; the
//! precision prelude (`shaders/real_f32.wgsl` or `real_f64.wgsl`) is prepended at pipeline
//! creation, then the layouts shared with the host (`gpu_layout::wgsl_declarations`), then
//! `shaders/common.wgsl`; the helpers a shader calls (`shape.wgsl`, `switch.wgsl`) follow it.

/// The precision a pipeline is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    F32,
    F64,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "float32",
            Precision::F64 => "float64",
        }
    }
}

/// One op-family shader file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shader {
    EnvMat,
    Dense,
    Contract,
    Radial,
    Angle,
    Attn,
    /// The attention block, written once over `num`: on reals, and on duals.
    AttnBlock,
    AttnBlockDual,
    /// The tape's ops, written once over `num`: on reals, and on duals.
    Tape,
    TapeDual,
    Scatter,
    Loss,
    Adam,
    Fill,
}

impl Shader {
    pub const ALL: [Shader; 14] = [
        Shader::EnvMat,
        Shader::Dense,
        Shader::Contract,
        Shader::Radial,
        Shader::Angle,
        Shader::Attn,
        Shader::AttnBlock,
        Shader::AttnBlockDual,
        Shader::Tape,
        Shader::TapeDual,
        Shader::Scatter,
        Shader::Loss,
        Shader::Adam,
        Shader::Fill,
    ];

    /// The shader's name (in pipeline keys, labels and profiles): its file, and for a pass
    /// written over `num`, the number type.
    pub fn name(self) -> &'static str {
        match self {
            Shader::EnvMat => "env_mat.wgsl",
            Shader::Dense => "dense.wgsl",
            Shader::Contract => "contract.wgsl",
            Shader::Radial => "radial.wgsl",
            Shader::Angle => "angle.wgsl",
            Shader::Attn => "attn.wgsl",
            Shader::AttnBlock => "attn_block.wgsl",
            Shader::AttnBlockDual => "attn_block.wgsl (dual)",
            Shader::Tape => "tape.wgsl",
            Shader::TapeDual => "tape.wgsl (dual)",
            Shader::Scatter => "scatter.wgsl",
            Shader::Loss => "loss.wgsl",
            Shader::Adam => "adam.wgsl",
            Shader::Fill => "fill.wgsl",
        }
    }

    /// Whether the shader binds the batch shape table, and so gets `shaders/shape.wgsl`.
    fn reads_shape(self) -> bool {
        matches!(
            self,
            Shader::Contract | Shader::Radial | Shader::Angle | Shader::Scatter | Shader::Loss
        )
    }

    /// Whether the shader calls the environment's switch, and so gets `shaders/switch.wgsl`.
    fn calls_switch(self) -> bool {
        matches!(self, Shader::EnvMat | Shader::Attn)
    }

    fn body(self) -> &'static str {
        match self {
            Shader::EnvMat => include_str!("../../../shaders/env_mat.wgsl"),
            Shader::Dense => concat!(
                include_str!("../../../shaders/dense.wgsl"),
                include_str!("../../../shaders/dense_tiled.wgsl")
            ),
            Shader::Contract => include_str!("../../../shaders/contract.wgsl"),
            Shader::Radial => include_str!("../../../shaders/radial.wgsl"),
            Shader::Angle => include_str!("../../../shaders/angle.wgsl"),
            Shader::Attn => include_str!("../../../shaders/attn.wgsl"),
            Shader::AttnBlock => concat!(
                include_str!("../../../shaders/num_real.wgsl"),
                include_str!("../../../shaders/attn_block.wgsl")
            ),
            Shader::AttnBlockDual => concat!(
                include_str!("../../../shaders/num_dual.wgsl"),
                include_str!("../../../shaders/attn_block.wgsl")
            ),
            Shader::Tape => concat!(
                include_str!("../../../shaders/num_real.wgsl"),
                include_str!("../../../shaders/tape.wgsl")
            ),
            Shader::TapeDual => concat!(
                include_str!("../../../shaders/num_dual.wgsl"),
                include_str!("../../../shaders/tape.wgsl")
            ),
            Shader::Scatter => include_str!("../../../shaders/scatter.wgsl"),
            Shader::Loss => include_str!("../../../shaders/loss.wgsl"),
            Shader::Adam => include_str!("../../../shaders/adam.wgsl"),
            Shader::Fill => include_str!("../../../shaders/fill.wgsl"),
        }
    }
}

/// The complete WGSL of one shader in one precision.
pub fn source(shader: Shader, prec: Precision) -> String {
    let prelude = match prec {
        Precision::F32 => include_str!("../../../shaders/real_f32.wgsl"),
        Precision::F64 => include_str!("../../../shaders/real_f64.wgsl"),
    };
    let common = include_str!("../../../shaders/common.wgsl");
    let shape = if shader.reads_shape() {
        include_str!("../../../shaders/shape.wgsl")
    } else {
        ""
    };
    let switch = if shader.calls_switch() {
        include_str!("../../../shaders/switch.wgsl")
    } else {
        ""
    };
    format!(
        "{prelude}\n{}\n{common}\n{}\n{shape}\n{switch}",
        crate::backend::gpu_layout::wgsl_declarations(),
        shader.body()
    )
}

/// How an entry point uses one storage binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
}

/// An entry point with the storage bindings it uses, in the order the host passes buffers.
/// Binding 0 is always the op's uniform block.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    pub shader: Shader,
    pub entry: &'static str,
    pub bindings: &'static [(u32, Access)],
}

use Access::{Read as R, Write as W};

macro_rules! kernel {
    ($name:ident, $shader:ident, $entry:literal, [$(($b:literal, $a:ident)),* $(,)?]) => {
        pub const $name: Kernel = Kernel { shader: Shader::$shader, entry: $entry, bindings: &[$(($b, $a)),*] };
    };
}

kernel!(
    ENV_MAT,
    EnvMat,
    "env_mat",
    [
        (1, R),
        (2, R),
        (3, R),
        (4, R),
        (5, R),
        (6, W),
        (7, W),
        (8, W)
    ]
);

// dense: params 1, xin 2, out0 3, out1 4, hin 5, ybar 6, ydotbar 7, zdot 8, scale 9, scratch 10,
// xdot 11, partial 12, grad 13
kernel!(
    DENSE_FORWARD,
    Dense,
    "forward",
    [(1, R), (2, R), (3, W), (4, W)]
);
kernel!(
    DENSE_TANGENT,
    Dense,
    "tangent",
    [(1, R), (2, R), (5, R), (3, W), (4, W)]
);
kernel!(
    DENSE_BACKWARD,
    Dense,
    "backward",
    [(1, R), (5, R), (6, R), (3, W)]
);
kernel!(
    DENSE_DUAL_Z,
    Dense,
    "dual_z",
    [(1, R), (5, R), (8, R), (9, R), (6, R), (7, R), (10, W)]
);
kernel!(
    DENSE_DUAL_WGRAD,
    Dense,
    "dual_wgrad",
    [(2, R), (11, R), (9, R), (10, W), (12, W)]
);
kernel!(DENSE_DUAL_BSUM, Dense, "dual_bsum", [(10, W), (12, W)]);
kernel!(DENSE_DUAL_WSUM, Dense, "dual_wsum", [(12, W), (13, W)]);
kernel!(
    DENSE_DUAL_XBAR,
    Dense,
    "dual_xbar",
    [(1, R), (10, W), (6, R), (7, R), (3, W), (4, W)]
);

// The tiled twins (shaders/dense_tiled.wgsl) bind what the flat kernels bind.
macro_rules! tiled {
    ($name:ident, $entry:literal, $flat:ident) => {
        pub const $name: Kernel = Kernel {
            shader: Shader::Dense,
            entry: $entry,
            bindings: $flat.bindings,
        };
    };
}
tiled!(DENSE_FORWARD_TILED, "forward_tiled", DENSE_FORWARD);
tiled!(DENSE_TANGENT_TILED, "tangent_tiled", DENSE_TANGENT);
tiled!(DENSE_BACKWARD_TILED, "backward_tiled", DENSE_BACKWARD);
tiled!(DENSE_DUAL_WGRAD_TILED, "dual_wgrad_tiled", DENSE_DUAL_WGRAD);
tiled!(DENSE_DUAL_XBAR_TILED, "dual_xbar_tiled", DENSE_DUAL_XBAR);

// contract: dims 1, g 2, gp 3, rhat 4, rdot 5, a 6, adot 7, dbar 8, ddotbar 9, out_a 10,
// out_d 11, jac 12, abar 13, q 14, adotbar 15
kernel!(
    CONTRACT_A_FORWARD,
    Contract,
    "a_forward",
    [(1, R), (2, R), (4, R), (10, W)]
);
kernel!(
    CONTRACT_D_OUTER,
    Contract,
    "d_outer",
    [(6, R), (7, R), (11, W)]
);
kernel!(
    CONTRACT_A_BACKWARD,
    Contract,
    "a_backward",
    [(6, R), (8, R), (10, W)]
);
kernel!(
    CONTRACT_SLOT_BACKWARD,
    Contract,
    "slot_backward",
    [(13, R), (2, R), (3, R), (4, R), (12, R), (14, W)]
);
kernel!(
    CONTRACT_A_TANGENT,
    Contract,
    "a_tangent",
    [(1, R), (2, R), (3, R), (4, R), (5, R), (10, W)]
);
kernel!(
    CONTRACT_DUAL_CENTRE,
    Contract,
    "dual_centre",
    [(6, R), (7, R), (8, R), (9, R), (10, W), (11, W)]
);
kernel!(
    CONTRACT_DUAL_SLOT,
    Contract,
    "dual_slot",
    [(13, R), (15, R), (4, R), (5, R), (10, W), (11, W)]
);
kernel!(CONTRACT_GBAR, Contract, "gbar", [(13, R), (4, R), (10, W)]);

// radial: dims 1, scale 2, g 3, sdot 4, dbar 5, ddotbar 6, jac 7, desc 8, q 9, gbar 10,
// gdotbar 11
kernel!(
    RADIAL_FORWARD,
    Radial,
    "radial_forward",
    [(1, R), (2, R), (3, R), (4, R), (8, W)]
);
kernel!(
    RADIAL_TANGENT,
    Radial,
    "radial_tangent",
    [(1, R), (2, R), (3, R), (4, R), (8, W)]
);
kernel!(
    RADIAL_BACKWARD,
    Radial,
    "radial_backward",
    [(2, R), (3, R), (5, R), (7, R), (9, W)]
);
kernel!(
    RADIAL_DUAL,
    Radial,
    "radial_dual",
    [(2, R), (5, R), (6, R), (10, W), (11, W)]
);

// angle: dims 1, weight 2, rhat 3, rdot 4, e 5, edot 6, g 7, gp 8, dbar 9, ddotbar 10, jac 11,
// ebar_out 12, ebar 13, out 14, gdotbar 15
kernel!(
    ANGLE_VALUES,
    Angle,
    "angle_values",
    [(1, R), (3, R), (14, W)]
);
kernel!(
    ANGLE_VALUES_TANGENT,
    Angle,
    "angle_values_tangent",
    [(1, R), (3, R), (4, R), (14, W)]
);
kernel!(
    ANGLE_FORWARD,
    Angle,
    "angle_forward",
    [(1, R), (2, R), (5, R), (6, R), (7, R), (8, R), (14, W)]
);
kernel!(
    ANGLE_TANGENT,
    Angle,
    "angle_tangent",
    [(1, R), (2, R), (5, R), (6, R), (7, R), (8, R), (14, W)]
);
kernel!(
    ANGLE_BACKWARD_PAIRS,
    Angle,
    "angle_backward_pairs",
    [(1, R), (2, R), (5, R), (7, R), (8, R), (9, R), (12, W)]
);
kernel!(
    ANGLE_BACKWARD_SLOTS,
    Angle,
    "angle_backward_slots",
    [(1, R), (3, R), (11, R), (13, R), (14, W)]
);
kernel!(
    ANGLE_DUAL,
    Angle,
    "angle_dual",
    [
        (1, R),
        (2, R),
        (5, R),
        (6, R),
        (9, R),
        (10, R),
        (14, W),
        (15, W)
    ]
);

// attn: env 1, rij 2, owner 3, dstd 4, sw_out 5, dsw_out 6, params 7, types 8, lead 9, out 10,
// xbar 11, partial 12, grad 13, nei_type 14, centre_type 15, sw_in 16, dsw_in 17, slot_row 18,
// slot_c 19, gs 20, gsp 21, tau 22, g_out 23, gdot_out 24, sdot 25, g0bar 26, g0dotbar 27,
// taubar 28
kernel!(
    ATTN_SWITCH,
    Attn,
    "attn_switch",
    [(1, R), (2, R), (3, R), (4, R), (5, W), (6, W)]
);
kernel!(TEBD_ROWS, Attn, "tebd_rows", [(7, R), (8, R), (10, W)]);
kernel!(TEBD_ROWS_LEAD, Attn, "tebd_rows_lead", [(9, R), (10, W)]);
kernel!(
    TEBD_ROWS_BACKWARD_PARTS,
    Attn,
    "tebd_rows_backward_parts",
    [(8, R), (11, R), (12, W)]
);
kernel!(
    TEBD_ROWS_BACKWARD_SUM,
    Attn,
    "tebd_rows_backward_sum",
    [(12, W), (13, W)]
);
kernel!(
    STRIP_SLOTS,
    Attn,
    "strip_slots",
    [(14, R), (15, R), (16, R), (17, R), (18, W), (19, W)]
);
kernel!(
    STRIP_FORWARD,
    Attn,
    "strip_forward",
    [
        (18, W),
        (19, W),
        (20, R),
        (21, R),
        (22, R),
        (23, W),
        (24, W)
    ]
);
kernel!(
    STRIP_DUAL,
    Attn,
    "strip_dual",
    [
        (18, W),
        (19, W),
        (22, R),
        (25, R),
        (26, R),
        (27, R),
        (23, W),
        (24, W)
    ]
);
kernel!(
    STRIP_DUAL_PARTS,
    Attn,
    "strip_dual_parts",
    [
        (18, W),
        (19, W),
        (20, R),
        (21, R),
        (25, R),
        (26, R),
        (27, R),
        (12, W)
    ]
);
kernel!(STRIP_DUAL_SUM, Attn, "strip_dual_sum", [(12, W), (28, W)]);

// attn_block: layer params 1, consts 3, ws 4, out 5, g0 6, g0p 7, rhat 8, rdot 9, sw 10,
// dsw 11, owner 12, seed 13, seed_eps 14, grad_at 16, grad 17, jac 18, q 19, g0bar 20,
// g0dotbar 21; the same entries on reals and on duals.
macro_rules! attn_block {
    ($load:ident, $block:ident, $backward:ident, $shader:ident) => {
        kernel!(
            $load,
            $shader,
            "attn_block_load",
            [
                (6, R),
                (7, R),
                (8, R),
                (9, R),
                (10, R),
                (11, R),
                (12, R),
                (4, W)
            ]
        );
        kernel!(
            $block,
            $shader,
            "attn_block_forward",
            [(1, R), (3, R), (4, W), (5, W)]
        );
        kernel!(
            $backward,
            $shader,
            "attn_block_backward",
            [(1, R), (3, R), (4, W), (13, R), (14, R)]
        );
    };
}
attn_block!(
    ATTN_BLOCK_LOAD,
    ATTN_BLOCK_FORWARD,
    ATTN_BLOCK_BACKWARD,
    AttnBlock
);
attn_block!(
    ATTN_BLOCK_LOAD_DUAL,
    ATTN_BLOCK_TANGENT,
    ATTN_BLOCK_DUAL,
    AttnBlockDual
);
kernel!(
    ATTN_BLOCK_Q,
    AttnBlock,
    "attn_block_q",
    [(4, W), (7, R), (11, R), (18, R), (19, W)]
);
kernel!(
    ATTN_BLOCK_ROT,
    AttnBlock,
    "attn_block_rot",
    [(4, W), (22, W)]
);
kernel!(
    ATTN_BLOCK_ABAR,
    AttnBlockDual,
    "attn_block_abar",
    [(4, W), (23, R)]
);
kernel!(
    ATTN_BLOCK_G0BAR,
    AttnBlockDual,
    "attn_block_g0bar",
    [(4, W), (20, W), (21, W)]
);
kernel!(
    ATTN_BLOCK_GRAD,
    AttnBlockDual,
    "attn_block_grad",
    [(4, W), (16, R), (17, W)]
);

// scatter: dims 1, e_fit 2, bias 3, e_atom 4, energy 5, csr_ptr 6, csr_ent 7, q 8, force 9,
// rij 10, owner 11, wpart 12, virial 13
kernel!(
    SCATTER_ATOM_ENERGY,
    Scatter,
    "atom_energy",
    [(1, R), (2, R), (3, R), (4, W)]
);
kernel!(
    SCATTER_FRAME_ENERGY,
    Scatter,
    "frame_energy",
    [(1, R), (4, W), (5, W)]
);
kernel!(
    SCATTER_GATHER_FORCE,
    Scatter,
    "gather_force",
    [(6, R), (7, R), (8, R), (9, W)]
);
kernel!(
    SCATTER_CENTRE_VIRIAL,
    Scatter,
    "centre_virial",
    [(1, R), (8, R), (10, R), (11, R), (12, W)]
);
kernel!(
    SCATTER_FRAME_VIRIAL,
    Scatter,
    "frame_virial",
    [(1, R), (12, W), (13, W)]
);

// loss: coef 1, pred 2, label 3, res 4, centre_atom 5, sums 6, fres 7, vres 8, jac 9, rij 10,
// owner 11, rdot 12, sdot 13, dims 14
kernel!(
    LOSS_RESIDUAL,
    Loss,
    "residual",
    [(1, R), (2, R), (3, R), (4, W)]
);
kernel!(
    LOSS_ENERGY_BAR,
    Loss,
    "energy_bar",
    [(1, R), (2, R), (3, R), (14, R), (4, W)]
);
kernel!(LOSS_SUMSQ, Loss, "sumsq", [(2, R), (3, R), (6, W)]);
kernel!(
    LOSS_VIRTUAL_TANGENT,
    Loss,
    "virtual_tangent",
    [
        (7, R),
        (8, R),
        (9, R),
        (10, R),
        (11, R),
        (5, R),
        (12, W),
        (13, W)
    ]
);
kernel!(
    LOSS_RIJ_TANGENT,
    Loss,
    "rij_tangent",
    [(7, R), (8, R), (10, R), (11, R), (5, R), (12, W)]
);

kernel!(ADAM, Adam, "adam", [(1, R), (2, R), (3, W), (4, W), (5, W)]);
kernel!(GRAD_NORM, Adam, "grad_norm", [(6, W), (7, W)]);
kernel!(CLIP_SCALE, Adam, "clip_scale", [(1, R), (6, W), (7, W)]);
kernel!(FILL, Fill, "fill", [(1, R), (2, W)]);

/// The tape's kernels on one number type (shaders/tape.wgsl says what each computes).
pub struct TapeKernels {
    pub linear: Kernel,
    pub linear_x: Kernel,
    pub linear_w: Kernel,
    pub linear_w_parts: Kernel,
    pub sum_parts: Kernel,
    pub bmm: Kernel,
    pub map: Kernel,
    pub zip: Kernel,
    pub reduce: Kernel,
    pub gather: Kernel,
    pub scatter: Kernel,
    pub sum_rows: Kernel,
    pub spread_rows: Kernel,
    pub softmax: Kernel,
    pub softmax_back: Kernel,
    pub copy_cols: Kernel,
    pub param: Kernel,
    pub param_grad: Kernel,
    pub pair: Kernel,
    pub part: Kernel,
}

// tape: cst 1, params 2, a 3, b 4, idx 5, y 6, y2 7
macro_rules! tape_kernels {
    ($name:ident, $shader:ident) => {
        pub const $name: TapeKernels = {
            const fn k(entry: &'static str, bindings: &'static [(u32, Access)]) -> Kernel {
                Kernel {
                    shader: Shader::$shader,
                    entry,
                    bindings,
                }
            }
            TapeKernels {
                linear: k("tape_linear", &[(2, R), (3, R), (6, W)]),
                linear_x: k("tape_linear_x", &[(2, R), (3, R), (6, W)]),
                linear_w: k("tape_linear_w", &[(3, R), (4, R), (6, W), (7, W)]),
                linear_w_parts: k("tape_linear_w_parts", &[(3, R), (7, W)]),
                sum_parts: k("tape_sum_parts", &[(3, R), (6, W)]),
                bmm: k("tape_bmm", &[(3, R), (4, R), (6, W)]),
                map: k("tape_map", &[(1, R), (3, R), (6, W), (7, W)]),
                zip: k("tape_zip", &[(1, R), (3, R), (4, R), (6, W)]),
                reduce: k("tape_reduce", &[(1, R), (3, R), (4, R), (6, W)]),
                gather: k("tape_gather", &[(3, R), (5, R), (6, W)]),
                scatter: k("tape_scatter", &[(3, R), (5, R), (6, W)]),
                sum_rows: k("tape_sum_rows", &[(3, R), (6, W)]),
                spread_rows: k("tape_spread_rows", &[(3, R), (6, W)]),
                softmax: k("tape_softmax", &[(3, R), (5, R), (6, W)]),
                softmax_back: k("tape_softmax_back", &[(3, R), (4, R), (6, W)]),
                copy_cols: k("tape_copy_cols", &[(3, R), (6, W)]),
                param: k("tape_param", &[(2, R), (6, W)]),
                param_grad: k("tape_param_grad", &[(3, R), (7, W)]),
                pair: k("tape_pair", &[(3, R), (4, R), (6, W)]),
                part: k("tape_part", &[(3, R), (6, W)]),
            }
        };
    };
}
tape_kernels!(TAPE, Tape);
tape_kernels!(TAPE_DUAL, TapeDual);

impl TapeKernels {
    /// The kernel of the walk's `k` (`backend/device_tape`).
    pub(crate) fn get(&self, k: crate::backend::device_tape::Kern) -> &Kernel {
        use crate::backend::device_tape::Kern;
        let kern = match k {
            Kern::Linear => &self.linear,
            Kern::LinearX => &self.linear_x,
            Kern::LinearW => &self.linear_w,
            Kern::LinearWParts => &self.linear_w_parts,
            Kern::SumParts => &self.sum_parts,
            Kern::Bmm => &self.bmm,
            Kern::Map => &self.map,
            Kern::Zip => &self.zip,
            Kern::Reduce => &self.reduce,
            Kern::Gather => &self.gather,
            Kern::Scatter => &self.scatter,
            Kern::SumRows => &self.sum_rows,
            Kern::SpreadRows => &self.spread_rows,
            Kern::Softmax => &self.softmax,
            Kern::SoftmaxBack => &self.softmax_back,
            Kern::CopyCols => &self.copy_cols,
            Kern::Param => &self.param,
            Kern::ParamGrad => &self.param_grad,
            Kern::Pair => &self.pair,
            Kern::Part => &self.part,
        };
        debug_assert_eq!(
            kern.entry,
            k.name(),
            "the walk's kernel names are the shader's"
        );
        kern
    }

    pub fn all(&self) -> [&Kernel; 20] {
        [
            &self.linear,
            &self.linear_x,
            &self.linear_w,
            &self.linear_w_parts,
            &self.sum_parts,
            &self.bmm,
            &self.map,
            &self.zip,
            &self.reduce,
            &self.gather,
            &self.scatter,
            &self.sum_rows,
            &self.spread_rows,
            &self.softmax,
            &self.softmax_back,
            &self.copy_cols,
            &self.param,
            &self.param_grad,
            &self.pair,
            &self.part,
        ]
    }
}

/// Every kernel, for the shader validation tests.
pub const ALL_KERNELS: &[&Kernel] = &[
    &ENV_MAT,
    &DENSE_FORWARD,
    &DENSE_TANGENT,
    &DENSE_BACKWARD,
    &DENSE_DUAL_Z,
    &DENSE_DUAL_WGRAD,
    &DENSE_DUAL_BSUM,
    &DENSE_DUAL_WSUM,
    &DENSE_DUAL_XBAR,
    &DENSE_FORWARD_TILED,
    &DENSE_TANGENT_TILED,
    &DENSE_BACKWARD_TILED,
    &DENSE_DUAL_WGRAD_TILED,
    &DENSE_DUAL_XBAR_TILED,
    &CONTRACT_A_FORWARD,
    &CONTRACT_D_OUTER,
    &CONTRACT_A_BACKWARD,
    &CONTRACT_SLOT_BACKWARD,
    &CONTRACT_A_TANGENT,
    &CONTRACT_DUAL_CENTRE,
    &CONTRACT_DUAL_SLOT,
    &CONTRACT_GBAR,
    &RADIAL_FORWARD,
    &RADIAL_TANGENT,
    &RADIAL_BACKWARD,
    &RADIAL_DUAL,
    &ANGLE_VALUES,
    &ANGLE_VALUES_TANGENT,
    &ANGLE_FORWARD,
    &ANGLE_TANGENT,
    &ANGLE_BACKWARD_PAIRS,
    &ANGLE_BACKWARD_SLOTS,
    &ANGLE_DUAL,
    &ATTN_SWITCH,
    &TEBD_ROWS,
    &TEBD_ROWS_LEAD,
    &TEBD_ROWS_BACKWARD_PARTS,
    &TEBD_ROWS_BACKWARD_SUM,
    &STRIP_SLOTS,
    &STRIP_FORWARD,
    &STRIP_DUAL,
    &STRIP_DUAL_PARTS,
    &STRIP_DUAL_SUM,
    &ATTN_BLOCK_LOAD,
    &ATTN_BLOCK_FORWARD,
    &ATTN_BLOCK_LOAD_DUAL,
    &ATTN_BLOCK_TANGENT,
    &ATTN_BLOCK_BACKWARD,
    &ATTN_BLOCK_DUAL,
    &ATTN_BLOCK_Q,
    &ATTN_BLOCK_ROT,
    &ATTN_BLOCK_ABAR,
    &ATTN_BLOCK_G0BAR,
    &ATTN_BLOCK_GRAD,
    &SCATTER_ATOM_ENERGY,
    &SCATTER_FRAME_ENERGY,
    &SCATTER_GATHER_FORCE,
    &SCATTER_CENTRE_VIRIAL,
    &SCATTER_FRAME_VIRIAL,
    &LOSS_RESIDUAL,
    &LOSS_ENERGY_BAR,
    &LOSS_SUMSQ,
    &LOSS_VIRTUAL_TANGENT,
    &LOSS_RIJ_TANGENT,
    &ADAM,
    &GRAD_NORM,
    &CLIP_SCALE,
    &FILL,
];
