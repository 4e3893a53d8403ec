//! Every WGSL shader parses and validates with naga in both precisions (float64 with the FLOAT64
//! capability), every kernel's table of bindings (src/backend/wgpu/shaders.rs) is exactly
//! what its entry point uses, and the parameter structs the shaders see have the Rust layout.
//! No GPU needed.
#![cfg(feature = "wgpu")]

use std::collections::BTreeSet;

use dpw::backend::gpu_layout::PARAMS;
use dpw::backend::wgpu::shaders::{
    source, Access, Precision, Shader, ALL_KERNELS, TAPE, TAPE_DUAL,
};
use naga::valid::{Capabilities, ValidationFlags, Validator};

fn module(shader: Shader, prec: Precision) -> (naga::Module, naga::valid::ModuleInfo) {
    let src = source(shader, prec);
    let m = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| {
        panic!(
            "{} ({}): {}",
            shader.name(),
            prec.name(),
            e.emit_to_string(&src)
        )
    });
    let caps = match prec {
        Precision::F32 => Capabilities::empty(),
        Precision::F64 => Capabilities::FLOAT64,
    };
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&m)
        .unwrap_or_else(|e| {
            panic!(
                "{} ({}): {}",
                shader.name(),
                prec.name(),
                e.emit_to_string(&src)
            )
        });
    (m, info)
}

#[test]
fn shaders_validate_in_both_precisions() {
    for prec in [Precision::F32, Precision::F64] {
        for shader in Shader::ALL {
            module(shader, prec);
        }
    }
}

#[test]
fn f64_shaders_need_the_capability() {
    let src = source(Shader::Dense, Precision::F64);
    let m = naga::front::wgsl::parse_str(&src).unwrap();
    assert!(
        Validator::new(ValidationFlags::all(), Capabilities::empty())
            .validate(&m)
            .is_err()
    );
}

#[test]
fn kernel_bindings_match_entry_points() {
    for prec in [Precision::F32, Precision::F64] {
        let tape = TAPE.all().into_iter().chain(TAPE_DUAL.all());
        for k in ALL_KERNELS.iter().copied().chain(tape) {
            let (m, info) = module(k.shader, prec);
            let ep = m
                .entry_points
                .iter()
                .position(|e| e.name == k.entry)
                .unwrap_or_else(|| panic!("{}: no entry point {}", k.shader.name(), k.entry));
            let fi = info.get_entry_point(ep);
            let mut used = BTreeSet::new();
            for (h, var) in m.global_variables.iter() {
                if fi[h].is_empty() {
                    continue;
                }
                let Some(rb) = &var.binding else { continue };
                assert_eq!(rb.group, 0);
                match var.space {
                    naga::AddressSpace::Uniform => {
                        assert_eq!(rb.binding, 0, "{}: uniform binding", k.entry)
                    }
                    naga::AddressSpace::Storage { access } => {
                        let rw = access.contains(naga::StorageAccess::STORE);
                        used.insert((rb.binding, rw));
                    }
                    _ => {}
                }
            }
            let declared: BTreeSet<_> = k
                .bindings
                .iter()
                .map(|&(b, a)| (b, a == Access::Write))
                .collect();
            assert_eq!(
                declared.len(),
                k.bindings.len(),
                "{}: a binding listed twice",
                k.entry
            );
            assert_eq!(
                used,
                declared,
                "{}:{}: (binding, read_write) used vs declared",
                k.shader.name(),
                k.entry
            );
        }
    }
}

/// The WGSL declarations generated from the Rust parameter structs lay them out as Rust does:
/// the same size and the same offset for every member, in both precisions.
#[test]
fn param_structs_have_the_rust_layout() {
    for prec in [Precision::F32, Precision::F64] {
        for shader in Shader::ALL {
            let (m, _) = module(shader, prec);
            for l in PARAMS {
                let ty = m
                    .types
                    .iter()
                    .find(|(_, t)| t.name.as_deref() == Some(l.name))
                    .unwrap_or_else(|| panic!("{}: no struct {}", shader.name(), l.name))
                    .1;
                let naga::TypeInner::Struct { members, span } = &ty.inner else {
                    panic!("{}: {} is no struct", shader.name(), l.name);
                };
                assert_eq!(*span as usize, l.size, "{}: size", l.name);
                let wgsl: Vec<_> = members
                    .iter()
                    .map(|m| (m.name.as_deref().unwrap_or(""), m.offset as usize))
                    .collect();
                let rust: Vec<_> = l.fields.iter().map(|f| (f.name, f.offset)).collect();
                assert_eq!(wgsl, rust, "{}: (member, offset)", l.name);
            }
        }
    }
}
