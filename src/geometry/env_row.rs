//! One row of the environment matrix and its derivative (docs/deepmd-spec.md §3), in f64: what the CPU backend
//! computes per slot and what the host-side statistics (`stat.rs`) average, from one definition.

/// Switch-function and protection parameters of the environment matrix (docs/deepmd-spec.md §3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EnvParams {
    pub rcut: f64,
    pub rcut_smth: f64,
    pub protection: f64,
}

/// Switch value and its derivative with respect to r (C2-smooth quintic, docs/deepmd-spec.md §3).
fn switch(r: f64, env: &EnvParams) -> (f64, f64) {
    if r <= env.rcut_smth {
        return (1.0, 0.0);
    }
    if r >= env.rcut {
        return (0.0, 0.0);
    }
    let w = env.rcut - env.rcut_smth;
    let u = (r - env.rcut_smth) / w;
    let sw = u * u * u * (-6.0 * u * u + 15.0 * u - 10.0) + 1.0;
    let dsw = (3.0 * u * u * (-6.0 * u * u + 15.0 * u - 10.0) + u * u * u * (-12.0 * u + 15.0)) / w;
    (sw, dsw)
}

/// The switch sw(r) of a neighbour at x and its slope dsw/ds against the raw radial value
/// s = sw/(r + p) ([`env_row`]'s `R[0]`), which DPA-1 needs to treat sw as a function of s.
pub fn env_switch(x: [f64; 3], env: &EnvParams) -> (f64, f64) {
    let r = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
    let rr = r + env.protection;
    let (sw, dsw) = switch(r, env);
    let ds = dsw / rr - sw / (rr * rr);
    (sw, if ds == 0.0 { 0.0 } else { dsw / ds })
}

/// Raw R = sw·[1/r, x/r², y/r², z/r²] and ∂R/∂r_ij (4×3), computed in f64.
pub fn env_row(x: [f64; 3], env: &EnvParams) -> ([f64; 4], [[f64; 3]; 4]) {
    let r = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
    let rr = r + env.protection;
    let (sw, dsw) = switch(r, env);
    let rhat = x.map(|v| v / r);
    let row = row_of(x, sw, rr);
    let mut jac = [[0.0; 3]; 4];
    let d0 = dsw / rr - sw / (rr * rr);
    let dv = dsw / (rr * rr) - 2.0 * sw / (rr * rr * rr);
    for a in 0..3 {
        jac[0][a] = d0 * rhat[a];
    }
    for k in 0..3 {
        for a in 0..3 {
            jac[k + 1][a] = x[k] * dv * rhat[a] + if k == a { sw / (rr * rr) } else { 0.0 };
        }
    }
    (row, jac)
}

/// The row of [`env_row`] without its derivative, for the statistics.
pub fn env_value(x: [f64; 3], env: &EnvParams) -> [f64; 4] {
    let r = (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]).sqrt();
    row_of(x, switch(r, env).0, r + env.protection)
}

fn row_of(x: [f64; 3], sw: f64, rr: f64) -> [f64; 4] {
    [
        sw / rr,
        sw * x[0] / (rr * rr),
        sw * x[1] / (rr * rr),
        sw * x[2] / (rr * rr),
    ]
}
