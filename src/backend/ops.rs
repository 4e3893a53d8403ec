//! The op table: every compute op of [`Backend`](super::Backend), written once — its
//! documentation, its arguments, the [`Op`](super::timed::Op) it is profiled as, the
//! floating-point work of one call (a multiply-add is 2; see `timed.rs`), and, for the ops a
//! backend may leave out, the default body. The ops come in families, a trait each over
//! [`Device`](super::Device): the shared ones (environment, dense layers, energy, loss and
//! optimizer), one per descriptor's own math, and [`FusedEmbedding`](super::FusedEmbedding), the
//! optional fused stage. A new descriptor adds a family here and to [`Backend`](super::Backend)'s
//! list, not methods to a trait every descriptor shares.
//!
//! `compute_ops!(m, args..)` hands the table to the macro `m`: `declare_ops!` (below) makes the
//! traits, `timed.rs` the profiling forwarders and the `Op` rows, `monomorphic.rs` the concrete
//! impls. So an op's signature is spelled out here, in each backend's body and in its kernels,
//! and nowhere else.
//!
//! A family: doc comments, `family Name { entries }`. An entry: doc comments,
//! `fn name(&self, arg: Type, ...) as OpRow;`, then `flops(inner) { expr }` where `inner` names
//! the wrapped backend (a [`Timeable`](super::timed::Timeable), for counts that need its
//! buffers; `_` when unused) and the arguments are in scope, then optionally `default { body }`.
//! The FLOP formulas are expanded in `timed.rs`, so the helpers they call live there.

macro_rules! compute_ops {
    ($then:ident $(, $given:tt)*) => {
        parse_ops! { $then [$($given)*];
        /// The environment of every slot, for every descriptor: the environment matrix, the tangent
        /// the force and virial seeds make of it, and the scatter of per-slot derivatives into
        /// forces and virials.
        family EnvOps {
            /// R̂, ∂R̂/∂r_ij and s = `R̂[0]` of every slot; padded slots (owner < 0) get R = 0, J = 0.
            fn env_mat(
                &self,
                d: &Dims,
                env: EnvParams,
                rij: &Self::Buf,
                owner: &Self::Idx,
                davg: &Self::Buf,
                dstd: &Self::Buf,
                rhat: &mut Self::Buf,
                jac: &mut Self::Buf,
                s: &mut Self::Buf,
            ) as EnvMat;
            flops(inner) {
                // ~60 FLOPs per real slot: the distance, the switch polynomial, R and its 4×3 Jacobian.
                let real = inner.count_real(owner);
                60.0 * real as f64
            }

            /// The force/virial seed as a tangent of the environment: u_ij = fres_i − fres_owner(j) −
            /// vres·r_ij, Ṙ = J u.
            fn virtual_tangent(
                &self,
                d: &Dims,
                fres: &Self::Buf,
                vres: &Self::Buf,
                jac: &Self::Buf,
                rij: &Self::Buf,
                owner: &Self::Idx,
                centre_atom: &Self::Idx,
                rdot: &mut Self::Buf,
                sdot: &mut Self::Buf,
            ) as VirtualTangent;
            flops(_) {
                // u = Δ − W r (3 + 9 multiply-adds), Ṙ = J u (12) per slot.
                2.0 * (3 + 9 + 12) as f64 * d.nslots() as f64
            }

            /// F = Σ own slots q − Σ slots owned q; W = −Σ q ⊗ r_ij per frame. `centre_atom[c]` and
            /// `owner` are batch atom indices `frame·natoms + atom`.
            fn force_virial(
                &self,
                d: &Dims,
                q: &Self::Buf,
                rij: &Self::Buf,
                owner: &Self::Idx,
                centre_atom: &Self::Idx,
                force: &mut Self::Buf,
                virial: &mut Self::Buf,
            ) as ForceVirial;
            flops(_) {
                // Two 3-vector sums and the 3×3 outer product per slot.
                (6 + 18) as f64 * d.nslots() as f64
            }
        }

        /// Dense layers on rows, for every net (embedding, fitting, DPA-1's type and strip nets).
        family DenseOps {
            /// One dense layer forward on `rows`: z = xW + b, h = tanh(z) (z if linear),
            /// y = h·idt + skip(x).
            fn dense_forward(
                &self,
                layer: &Layer,
                params: &Self::Buf,
                rows: Range<usize>,
                x: &Self::Buf,
                h: &mut Self::Buf,
                y: &mut Self::Buf,
            ) as DenseForward;
            flops(_) { 2.0 * dense_macs(layer, &rows) }

            /// Input gradient of one layer from its output h = tanh(z) (or z):
            /// x̄ = (φ'(z)⊙(ȳ·idt))Wᵀ + skipᵀ(ȳ).
            fn dense_backward(
                &self,
                layer: &Layer,
                params: &Self::Buf,
                rows: Range<usize>,
                h: &Self::Buf,
                ybar: &Self::Buf,
                xbar: &mut Self::Buf,
            ) as DenseBackward;
            flops(_) { 2.0 * dense_macs(layer, &rows) }

            /// Forward tangent: ż = ẋW, ẏ = φ'(z)⊙ż·idt + skip(ẋ).
            fn dense_tangent(
                &self,
                layer: &Layer,
                params: &Self::Buf,
                rows: Range<usize>,
                h: &Self::Buf,
                xdot: &Self::Buf,
                zdot: &mut Self::Buf,
                ydot: &mut Self::Buf,
            ) as DenseTangent;
            flops(_) { 2.0 * dense_macs(layer, &rows) }

            /// Reverse pass on (value, tangent) pairs (docs/design.md §3.2, "dual reverse"): accumulates W̄, b̄,
            /// īdt into `grad` at the layer's offsets and, when asked, writes x̄ and ẋ̄. When `scale` is
            /// given, the stored tangents ẋ, ż of row r are multiplied by `scale[r]` (the embedding
            /// net stores its tangents for a unit input tangent).
            fn dense_dual_backward(
                &self,
                layer: &Layer,
                params: &Self::Buf,
                rows: Range<usize>,
                io: DenseIo<Self::Buf>,
                xdot: &Self::Buf,
                zdot: &Self::Buf,
                scale: Option<&Self::Buf>,
                ybar: &Self::Buf,
                ydotbar: &Self::Buf,
                grad: &mut Self::Buf,
                xbar: Option<(&mut Self::Buf, &mut Self::Buf)>,
            ) as DenseDualBackward;
            flops(_) {
                // W̄ from the value and the tangent pair, and x̄, ẋ̄ when asked.
                let gemms = if xbar.is_some() { 4.0 } else { 2.0 };
                2.0 * gemms * dense_macs(layer, &rows)
            }
        }

        /// se_e2_a's contraction of the embedding with the environment.
        family ContractOps {
            /// A_c = (1/nnei) Σ_slots G ⊗ R̂ and D_c = A_c A_c<ᵀ. A-shaped buffers (A, Ā, Ȧ) are
            /// `[nc][4][M1]` on every backend, D-shaped ones `[nc][M1][M2]`, so that each op's outputs
            /// can be compared across backends.
            fn contract_forward(
                &self,
                d: &Dims,
                g: &Self::Buf,
                rhat: &Self::Buf,
                a: &mut Self::Buf,
                desc: &mut Self::Buf,
            ) as ContractForward;
            flops(_) {
                // A: 4·M1 per slot; D: M1·M2·4 per centre.
                2.0 * (4 * d.m1 * d.nslots() + 4 * d.m1 * d.m2 * d.ncentres()) as f64
            }

            /// Ā = D̄ A< + [D̄ᵀ A] in the first M2 rows.
            fn contract_backward(
                &self,
                d: &Dims,
                a: &Self::Buf,
                dbar: &Self::Buf,
                abar: &mut Self::Buf,
            ) as ContractBackward;
            flops(_) {
                // Two products of D̄ with A: 2·4·M1·M2 per centre.
                2.0 * (8 * d.m1 * d.m2 * d.ncentres()) as f64
            }

            /// Per slot: R̄ = (1/nnei)(Āᵀ G) + e₀ (1/nnei)(G'·Ā R̂), q = Jᵀ R̄ = ∂E/∂r_ij.
            fn slot_backward(
                &self,
                d: &Dims,
                abar: &Self::Buf,
                g: &Self::Buf,
                gp: &Self::Buf,
                rhat: &Self::Buf,
                jac: &Self::Buf,
                q: &mut Self::Buf,
            ) as SlotBackward;
            flops(_) {
                // Ā·G and Ā·G' (8 dots of length M1) per slot.
                2.0 * (8 * d.m1 * d.nslots()) as f64
            }

            /// Tangent of the contraction: Ȧ = (1/nnei) Σ (G'ṡ ⊗ R̂ + G ⊗ Ṙ), Ḋ = Ȧ A<ᵀ + A Ȧ<ᵀ.
            fn contract_tangent(
                &self,
                d: &Dims,
                g: &Self::Buf,
                gp: &Self::Buf,
                rhat: &Self::Buf,
                rdot: &Self::Buf,
                a: &Self::Buf,
                adot: &mut Self::Buf,
                ddot: &mut Self::Buf,
            ) as ContractTangent;
            flops(_) {
                // Ȧ: 8·M1 per slot; Ḋ: two M1×M2×4 products per centre.
                2.0 * (8 * d.m1 * d.nslots() + 8 * d.m1 * d.m2 * d.ncentres()) as f64
            }

            /// Dual reverse of the contraction down to the slots: Ḡ and Ġ̄ per slot.
            fn contract_dual(
                &self,
                d: &Dims,
                a: &Self::Buf,
                adot: &Self::Buf,
                dbar: &Self::Buf,
                ddotbar: &Self::Buf,
                rhat: &Self::Buf,
                rdot: &Self::Buf,
                gbar: &mut Self::Buf,
                gdotbar: &mut Self::Buf,
            ) as ContractDual;
            flops(_) { contract_dual_flops(d) }

            /// Ḡ += (1/nnei) Ā R̂ per slot: A's reverse into G alone, for an Ā that reaches A
            /// from outside D (a tensor fitting's ∂L/∂gr, docs/deepmd-spec.md §17).
            fn contract_gbar(
                &self,
                d: &Dims,
                abar: &Self::Buf,
                rhat: &Self::Buf,
                gbar: &mut Self::Buf,
            ) as ContractGbar;
            flops(_) {
                // A 4-term dot per slot and row.
                2.0 * (4 * d.m1 * d.nslots()) as f64
            }
        }

        /// se_e2_r's descriptor: the embedding summed over each centre's slots.
        family RadialOps {
            /// se_e2_r's descriptor: D_c = k Σ_{slots of c} G_s, `[nc][M1]`, k = [`radial_scale`].
            fn radial_forward(&self, d: &Dims, g: &Self::Buf, desc: &mut Self::Buf) as RadialForward;
            flops(_) {
                // M1 per slot.
                (d.m1 * d.nslots()) as f64
            }

            /// Its tangent: Ḋ_c = k Σ_s G'_s ṡ_s.
            fn radial_tangent(
                &self,
                d: &Dims,
                gp: &Self::Buf,
                sdot: &Self::Buf,
                ddot: &mut Self::Buf,
            ) as RadialTangent;
            flops(_) {
                // A multiply-add of M1 per slot.
                2.0 * (d.m1 * d.nslots()) as f64
            }

            /// Its backward to the slots: q_s = k (G'_s·D̄_c) `J_s[0]` = ∂E/∂r_ij (J's radial row).
            fn radial_backward(
                &self,
                d: &Dims,
                dbar: &Self::Buf,
                gp: &Self::Buf,
                jac: &Self::Buf,
                q: &mut Self::Buf,
            ) as RadialBackward;
            flops(_) {
                // G'·D̄ (a dot of length M1) per slot.
                2.0 * (d.m1 * d.nslots()) as f64
            }

            /// Its dual reverse down to the slots: Ḡ_s = k D̄_c, Ġ̄_s = k Ḋ̄_c.
            fn radial_dual(
                &self,
                d: &Dims,
                dbar: &Self::Buf,
                ddotbar: &Self::Buf,
                gbar: &mut Self::Buf,
                gdotbar: &mut Self::Buf,
            ) as RadialDual;
            flops(_) {
                // Two scaled copies of M1 per slot.
                2.0 * (d.m1 * d.nslots()) as f64
            }
        }

        /// se_e3's descriptor: the embedding of each pair's angle, weighted by it.
        family AngleOps {
            /// se_e3's pair values e_p = r̃_j·r̃_k, `[npairs]` in the rows of [`Dims::pairs`], where
            /// r̃ = R̂[1..4] of the pair's two slots.
            fn angle_values(&self, d: &Dims, rhat: &Self::Buf, e: &mut Self::Buf) as AngleValues;
            flops(_) {
                // A dot of three per pair.
                5.0 * d.pairs().len() as f64
            }

            /// Their tangent ė_p = ṙ_j·r̃_k + r̃_j·ṙ_k, ṙ = Ṙ[1..4].
            fn angle_values_tangent(
                &self,
                d: &Dims,
                rhat: &Self::Buf,
                rdot: &Self::Buf,
                edot: &mut Self::Buf,
            ) as AngleValuesTangent;
            flops(_) {
                // Two dots of three and their sum per pair.
                11.0 * d.pairs().len() as f64
            }

            /// se_e3's descriptor: D_c = Σ_{pairs of c} w_p e_p G_p, `[nc][M1]`, w_p =
            /// [`Dims::pair_weight`] of the pair's type.
            fn angle_forward(
                &self,
                d: &Dims,
                e: &Self::Buf,
                g: &Self::Buf,
                desc: &mut Self::Buf,
            ) as AngleForward;
            flops(_) {
                // A multiply-add of M1 per pair.
                2.0 * (d.m1 * d.pairs().len()) as f64
            }

            /// Its tangent: Ḋ_c = Σ_p w_p ė_p (G_p + e_p G'_p).
            fn angle_tangent(
                &self,
                d: &Dims,
                e: &Self::Buf,
                edot: &Self::Buf,
                g: &Self::Buf,
                gp: &Self::Buf,
                ddot: &mut Self::Buf,
            ) as AngleTangent;
            flops(_) {
                // G + e G', scaled and added: four per element of M1, per pair.
                4.0 * (d.m1 * d.pairs().len()) as f64
            }

            /// Its backward to the slots: ē_p = w_p D̄_c·(G_p + e_p G'_p), r̃̄_j += ē_p r̃_k,
            /// r̃̄_k += ē_p r̃_j, q_s = J_s[1..4]ᵀ r̃̄_s = ∂E/∂r_ij.
            fn angle_backward(
                &self,
                d: &Dims,
                rhat: &Self::Buf,
                jac: &Self::Buf,
                e: &Self::Buf,
                g: &Self::Buf,
                gp: &Self::Buf,
                dbar: &Self::Buf,
                q: &mut Self::Buf,
            ) as AngleBackward;
            flops(_) {
                // Two dots of M1 and two 3-vector multiply-adds per pair, a 3×3 product per slot.
                ((4 * d.m1 + 12) * d.pairs().len() + 18 * d.nslots()) as f64
            }

            /// Its dual reverse down to the pairs (no adjoint flows into e): Ḡ_p = w_p (e_p D̄_c +
            /// ė_p Ḋ̄_c), Ġ̄_p = w_p e_p Ḋ̄_c.
            fn angle_dual(
                &self,
                d: &Dims,
                e: &Self::Buf,
                edot: &Self::Buf,
                dbar: &Self::Buf,
                ddotbar: &Self::Buf,
                gbar: &mut Self::Buf,
                gdotbar: &mut Self::Buf,
            ) as AngleDual;
            flops(_) {
                // Ḡ: two scaled rows summed; Ġ̄: one scaled row; of M1 per pair.
                4.0 * (d.m1 * d.pairs().len()) as f64
            }
        }

        /// DPA-1 (se_atten, se_atten_v2): the type embedding, the strip and the attention block.
        /// Every op has a host body as its default (`attn.rs`), so a backend runs DPA-1 before
        /// it has kernels of its own.
        family AttnOps {
            /// DPA-1: the switch σ and its slope dσ/dŝ against the slot's normalised radial value,
            /// per slot (0 for padding), for the smooth attention and strip (docs/design.md §11).
            fn attn_switch(
                &self,
                d: &Dims,
                env: EnvParams,
                rij: &Self::Buf,
                owner: &Self::Idx,
                dstd: &Self::Buf,
                sw: &mut Self::Buf,
                dsw: &mut Self::Buf,
            ) as AttnSwitch;
            flops(_) { 30.0 * d.nslots() as f64 }
            default { crate::backend::attn::attn_switch(self, d, env, rij, owner, dstd, (sw, dsw)) }

            /// DPA-1: rows of type-embedding values, `out[r·stride + col..]` =
            /// `[lead[r], T[types[0][r]], T[types[1][r]], ...]` (no lead column without `lead`):
            /// the embedding net's input `[ŝ, T[t_j], T[t_i]]`, the descriptor's appended `T[t_i]`.
            fn tebd_rows(
                &self,
                tebd: &TebdLayout,
                params: &Self::Buf,
                lead: Option<&Self::Buf>,
                types: &[&Self::Idx],
                out: &mut Self::Buf,
                stride: usize,
                col: usize,
            ) as TebdRows;
            flops(_) { 0.0 }
            default {
                crate::backend::attn::tebd_rows(self, tebd, params, lead, types, out, stride, col)
            }

            /// Adjoint of [`AttnOps::tebd_rows`]: the type columns of `xbar` into the type
            /// embedding's gradient.
            fn tebd_rows_backward(
                &self,
                tebd: &TebdLayout,
                lead: bool,
                types: &[&Self::Idx],
                xbar: &Self::Buf,
                stride: usize,
                col: usize,
                grad: &mut Self::Buf,
            ) as TebdRowsBackward;
            flops(_) { 0.0 }
            default {
                crate::backend::attn::tebd_rows_backward(self, tebd, lead, types, xbar, stride, col, grad)
            }

            /// DPA-1's strip (se_atten_v2): G⁰ = G_s ⊙ (1 + c τ[t_i, t_j]) and G⁰' = ∂G⁰/∂ŝ per slot,
            /// c = σ when smooth, else 1.
            fn strip_forward(
                &self,
                a: &StripArgs<Self::Buf, Self::Idx>,
                g0: &mut Self::Buf,
                g0p: &mut Self::Buf,
            ) as StripForward;
            flops(inner) { 6.0 * inner.len(g0) as f64 }
            default { crate::backend::attn::strip_forward(self, a, g0, g0p) }

            /// The dual reverse of [`AttnOps::strip_forward`] for the tangent ṡ: (Ḡ_s, Ġ̄_s) per slot
            /// and τ̄ per row of the type net's table.
            fn strip_dual(
                &self,
                a: &StripArgs<Self::Buf, Self::Idx>,
                sdot: &Self::Buf,
                g0_adjoints: (&Self::Buf, &Self::Buf),
                gs_adjoints: (&mut Self::Buf, &mut Self::Buf),
                taubar: &mut Self::Buf,
            ) as StripDual;
            flops(inner) { 12.0 * inner.len(sdot) as f64 * a.m1 as f64 }
            default {
                crate::backend::attn::strip_dual(self, a, sdot, g0_adjoints, gs_adjoints, taubar)
            }

            /// DPA-1's attention layers and contraction, per centre: D `[nc][stride]` (its first
            /// M1·M2 columns) from G⁰ and R̂ (docs/design.md §11.1), and where given A
            /// `[nc][4][M1]`, whose rows 1..3 are the rotation matrix a tensor fitting reads.
            fn attn_forward(
                &self,
                d: &Dims,
                a: &AttnArgs<Self::Buf, Self::Idx>,
                desc: &mut Self::Buf,
                stride: usize,
                rot: Option<&mut Self::Buf>,
            ) as AttnForward;
            flops(_) { attn_flops(d, a) }
            default { crate::backend::attn::attn_forward(self, d, a, desc, stride, rot) }

            /// Forces of the attention block: q = ∂E/∂r_ij per slot from D̄, through R̂, σ and G⁰'s
            /// dependence on ŝ (docs/design.md §11.2).
            fn attn_backward(
                &self,
                d: &Dims,
                a: &AttnArgs<Self::Buf, Self::Idx>,
                jac: &Self::Buf,
                dbar: &Self::Buf,
                stride: usize,
                q: &mut Self::Buf,
            ) as AttnBackward;
            flops(_) { 2.0 * attn_flops(d, a) }
            default { crate::backend::attn::attn_backward(self, d, a, jac, dbar, stride, q) }

            /// Ḋ of the attention block for the tangent Ṙ of R̂ (docs/design.md §11.3).
            fn attn_tangent(
                &self,
                d: &Dims,
                a: &AttnArgs<Self::Buf, Self::Idx>,
                rdot: &Self::Buf,
                ddot: &mut Self::Buf,
                stride: usize,
            ) as AttnTangent;
            flops(_) { 2.0 * attn_flops(d, a) }
            default { crate::backend::attn::attn_tangent(self, d, a, rdot, ddot, stride) }

            /// The dual reverse of the attention block from (D̄, Ḋ̄) and a tensor fitting's Ā
            /// (`a.abar`): its layers' gradient added to `grad`, Ḡ⁰ and Ġ̄⁰ per slot written
            /// (docs/design.md §11.4).
            fn attn_dual(
                &self,
                d: &Dims,
                a: &AttnArgs<Self::Buf, Self::Idx>,
                rdot: &Self::Buf,
                adjoints: (&Self::Buf, &Self::Buf),
                stride: usize,
                g0_adjoints: (&mut Self::Buf, &mut Self::Buf),
                grad: &mut Self::Buf,
            ) as AttnDual;
            flops(_) { 4.0 * attn_flops(d, a) }
            default {
                crate::backend::attn::attn_dual(self, d, a, rdot, adjoints, stride, g0_adjoints, grad)
            }
        }

        /// DPA-3 (docs/deepmd-spec.md §18): the RepFlow block from r_ij to D, with its derived
        /// tangent and dual reverse. Every op has a host body as its default (`repflow.rs`), so a
        /// backend runs DPA-3 before it has kernels of its own.
        family BlockOps {
            /// D `[nc][width]` of every centre from the slots' r_ij.
            fn block_forward(
                &self,
                d: &Dims,
                a: &BlockArgs<Self::Buf, Self::Idx>,
                desc: &mut Self::Buf,
            ) as BlockForward;
            flops(_) { block_flops(d, a) }
            default { crate::backend::block::block_forward(self, d, a, desc) }

            /// q = ∂E/∂r_ij `[nslots][3]` from D̄.
            fn block_backward(
                &self,
                d: &Dims,
                a: &BlockArgs<Self::Buf, Self::Idx>,
                dbar: &Self::Buf,
                q: &mut Self::Buf,
            ) as BlockBackward;
            flops(_) { 3.0 * block_flops(d, a) }
            default { crate::backend::block::block_backward(self, d, a, dbar, q) }

            /// Ḋ for the tangent ṙ_ij `[nslots][3]`.
            fn block_tangent(
                &self,
                d: &Dims,
                a: &BlockArgs<Self::Buf, Self::Idx>,
                rijdot: &Self::Buf,
                ddot: &mut Self::Buf,
            ) as BlockTangent;
            flops(_) { 2.0 * block_flops(d, a) }
            default { crate::backend::block::block_tangent(self, d, a, rijdot, ddot) }

            /// The dual reverse from (D̄, Ḋ̄) for the tangent ṙ_ij: the block's parameter gradient
            /// added to `grad`.
            fn block_dual(
                &self,
                d: &Dims,
                a: &BlockArgs<Self::Buf, Self::Idx>,
                rijdot: &Self::Buf,
                adjoints: (&Self::Buf, &Self::Buf),
                grad: &mut Self::Buf,
            ) as BlockDual;
            flops(_) { 8.0 * block_flops(d, a) }
            default { crate::backend::block::block_dual(self, d, a, rijdot, adjoints, grad) }

            /// ṙ_ij = fres_i − fres_owner(j) − vres·r_ij per slot (0 for padding): the training
            /// seed as a tangent of r_ij itself, for DPA-3, which reads r_ij rather than R̂.
            fn rij_tangent(
                &self,
                d: &Dims,
                fres: &Self::Buf,
                vres: &Self::Buf,
                rij: &Self::Buf,
                owner: &Self::Idx,
                centre_atom: &Self::Idx,
                rijdot: &mut Self::Buf,
            ) as RijTangent;
            flops(_) { 2.0 * (3 + 9) as f64 * d.nslots() as f64 }
            default {
                crate::backend::block::rij_tangent(self, d, fres, vres, rij, owner, centre_atom, rijdot)
            }
        }

        /// A pair table mixed into the DP model's energy (`use_srtab`, `linear_ener`;
        /// docs/deepmd-spec.md §19): the batch's weights and table terms
        /// ([`ShortRangeBatch`](crate::stage::pairtab::ShortRangeBatch), made on the host, since
        /// the table has no parameters) applied to the DP model's atomic energies, to ∂E/∂r_ij
        /// and to the loss's energy seed. Host bodies as the defaults (`pairtab.rs`): a few
        /// values per centre and slot.
        family PairOps {
            /// [`TrainOps::energy`] of a mixed model: `e_atom` = weight·e_fit + pair_e +
            /// `bias[type]` per centre, E_f their sum per frame.
            fn mix_energy(
                &self,
                d: &Dims,
                e_fit: &Self::Buf,
                bias: &Self::Buf,
                weight: &Self::Buf,
                pair_e: &Self::Buf,
                e_atom: &mut Self::Buf,
                energy: &mut Self::Buf,
            ) as MixEnergy;
            flops(_) { 4.0 * d.ncentres() as f64 }
            default {
                crate::backend::pairtab::mix_energy(self, d, e_fit, bias, weight, pair_e, e_atom, energy)
            }

            /// q += e_fit (of the slot's centre)·dweight per slot: the weight's change meeting
            /// the DP energy in ∂E/∂r_ij (the DP model's own share is its backward seeded with
            /// the weights).
            fn mix_force(
                &self,
                d: &Dims,
                e_fit: &Self::Buf,
                dweight: &Self::Buf,
                q: &mut Self::Buf,
            ) as MixForce;
            flops(_) { 6.0 * d.nslots() as f64 }
            default { crate::backend::pairtab::mix_force(self, d, e_fit, dweight, q) }

            /// force += pair_force, virial += pair_virial: the table's own forces and virial,
            /// made on the host (on its own neighbour list where it has one).
            fn mix_table(
                &self,
                d: &Dims,
                pair_force: &Self::Buf,
                pair_virial: &Self::Buf,
                force: &mut Self::Buf,
                virial: &mut Self::Buf,
            ) as MixTable;
            flops(_) { 3.0 * (d.nframes * d.natoms + 3 * d.nframes) as f64 }
            default { crate::backend::pairtab::mix_table(self, pair_force, pair_virial, force, virial) }

            /// ebar = weight·ebar + Σ_slots dweight·ṙ_ij per centre: the seed of e_DP in the dual
            /// reverse, read through its weight and, along the tangent ṙ_ij, through the
            /// weight's change.
            fn mix_seed(
                &self,
                d: &Dims,
                weight: &Self::Buf,
                dweight: &Self::Buf,
                rijdot: &Self::Buf,
                ebar: &mut Self::Buf,
            ) as MixSeed;
            flops(_) { 8.0 * d.nslots() as f64 }
            default { crate::backend::pairtab::mix_seed(self, d, weight, dweight, rijdot, ebar) }
        }

        /// The energy, the loss and the optimizer, the same for every model.
        family TrainOps {
            /// Per-frame energy E_f = Σ atoms (E_atom + `bias[type]`) and the per-centre energies with bias.
            fn energy(
                &self,
                d: &Dims,
                e_fit: &Self::Buf,
                bias: &Self::Buf,
                e_atom: &mut Self::Buf,
                energy: &mut Self::Buf,
            ) as Energy;
            flops(_) { 2.0 * d.ncentres() as f64 }

            /// Residuals of a batch and the seeds of the gradient pass: `ebar[c]` = ∂L/∂E of the
            /// centre's frame; `fres`, `vres` = ∂L/∂F, ∂L/∂W (the loss is a mean over frames); and
            /// `sums` = [Σ ΔE², Σ ΔF², Σ ΔW²] ([`LossSums::from_values`]). The sums stay on the device so
            /// that a step needs no read-back (a browser cannot wait for one).
            fn loss(
                &self,
                d: &Dims,
                pref: Prefactors,
                pred: [&Self::Buf; 3],
                label: [&Self::Buf; 3],
                ebar: &mut Self::Buf,
                fres: &mut Self::Buf,
                vres: &mut Self::Buf,
                sums: &mut Self::Buf,
            ) as Loss;
            flops(_) { 4.0 * (d.nframes * (d.natoms * 3 + 10)) as f64 }

            /// Gradient clipping on the device: `norm[at]` = ‖grad‖₂ (squares summed in f64 in index
            /// order where the device has f64), and grad ×= max/(‖grad‖ + 1e-6) when that is below 1,
            /// the factor rounded once to T. One op rather than a norm op and a scale op, so the factor
            /// comes from the norm in f64, not from its rounding to T.
            fn clip_grad_norm(
                &self,
                grad: &mut Self::Buf,
                max: f64,
                norm: &mut Self::Buf,
                at: usize,
            ) as ClipGradNorm;
            flops(inner) {
                // A square and an add per value, then a multiply.
                3.0 * inner.len(grad) as f64
            }

            /// Adam (torch's form, bias-corrected) on the whole parameter vector.
            fn adam(
                &self,
                s: AdamStep,
                params: &mut Self::Buf,
                grad: &Self::Buf,
                m: &mut Self::Buf,
                v: &mut Self::Buf,
            ) as Adam;
            flops(inner) {
                // ~12 FLOPs per parameter (two moments, the bias-corrected step).
                12.0 * inner.len(params) as f64
            }
        }

        /// The embedding nets as one fused stage, an optional op object that a backend offers
        /// through [`Device::fused_embedding`]. Without it the step runs the nets layer by layer
        /// ([`DenseOps`]), with se_e2_a's [`ContractOps::contract_dual`] before them: the layered
        /// fallback, which every backend has.
        family FusedEmbedding {
            /// Every embedding net at once (`nets[ti·ntypes + tj]` serves block (ti, tj)): G and
            /// G' = dG/ds of every slot, `[nslots][M1]`, from s.
            fn embed_forward(
                &self,
                d: &Dims,
                nets: &[&Net],
                params: &Self::Buf,
                s: &Self::Buf,
                owner: &Self::Idx,
                g: &mut Self::Buf,
                gp: &mut Self::Buf,
            ) as EmbedForward;
            flops(inner) {
                // Values and s-derivatives: two GEMMs per layer on the real slots.
                let real = inner.count_real(owner);
                2.0 * 2.0 * embed_flops(d, nets, real, net_macs)
            }

            /// The dual reverse of every embedding net from (Ḡ, Ġ̄) with input tangent ṡ,
            /// accumulated into `grad`.
            fn embed_dual_backward(
                &self,
                d: &Dims,
                nets: &[&Net],
                params: &Self::Buf,
                s: &Self::Buf,
                owner: &Self::Idx,
                sdot: &Self::Buf,
                gbar: &Self::Buf,
                gdotbar: &Self::Buf,
                grad: &mut Self::Buf,
            ) as EmbedDualBackward;
            flops(inner) { embed_dual_flops(d, nets, inner.count_real(owner)) }

            /// se_e2_a's dual reverse below the descriptor in one stage: what
            /// [`ContractOps::contract_dual`] then [`FusedEmbedding::embed_dual_backward`] do,
            /// with each slot's Ḡ, Ġ̄ made where the nets' dual reads them, so that no buffer of
            /// them is kept.
            fn contract_embed_dual(
                &self,
                d: &Dims,
                nets: &[&Net],
                params: &Self::Buf,
                s: &Self::Buf,
                owner: &Self::Idx,
                sdot: &Self::Buf,
                contract: ContractDual<Self::Buf>,
                grad: &mut Self::Buf,
            ) as ContractEmbedDual;
            flops(inner) {
                // The two stages' work: the fused stage does what they do.
                contract_dual_flops(d) + embed_dual_flops(d, nets, inner.count_real(owner))
            }
        }
        }
    };
}

/// Reads the table once and hands it to `$then` (after the arguments given to `compute_ops!`,
/// in brackets) as `Family [attributes] [entries]` per family, an entry being
/// `{ name, OpRow, [attributes], self, [arguments], inner, { flops }, [default body] }`.
macro_rules! parse_ops {
    ($then:ident [$($given:tt)*]; $(
        $(#[$fm:meta])*
        family $family:ident {
            $(
                $(#[$m:meta])*
                fn $name:ident(&$slf:ident $(, $arg:ident: $ty:ty)* $(,)?) as $op:ident;
                flops($inner:tt) $flops:block
                $(default $body:block)?
            )*
        }
    )*) => {
        $then! { [$($given)*] $(
            $family [$(#[$fm])*] [$(
                { $name, $op, [$(#[$m])*], $slf, [$($arg: $ty),*], $inner, $flops, [$($body)?] }
            )*]
        )* }
    };
}

/// A trait per family from the table, its methods declared, or given their default bodies where
/// the entry has one (whose arguments may go unused: an op left out is never called).
macro_rules! declare_ops {
    ([] $($family:ident [$(#[$fm:meta])*] [$({
        $name:ident, $op:ident, [$(#[$m:meta])*], $slf:ident, [$($arg:ident: $ty:ty),*],
        $inner:tt, $flops:block, [$($body:block)?]
    })*])*) => {
        $(
            $(#[$fm])*
            // The ops take the buffers they read and write one by one: a struct per op would be
            // a second place that spells its arguments out.
            #[allow(clippy::too_many_arguments)]
            pub trait $family<T: Real>: Device<T> {
                $(declare_ops!(@one [$(#[$m])*] $name [$slf] [$($arg: $ty),*] [$($body)?]);)*
            }
        )*
    };
    (@one [$(#[$m:meta])*] $name:ident [$slf:ident] [$($arg:ident: $ty:ty),*] []) => {
        $(#[$m])*
        fn $name(&$slf, $($arg: $ty),*);
    };
    (@one [$(#[$m:meta])*] $name:ident [$slf:ident] [$($arg:ident: $ty:ty),*] [$body:block]) => {
        $(#[$m])*
        #[allow(unused_variables)]
        fn $name(&$slf, $($arg: $ty),*) $body
    };
}
