//! Keys the message-passing descriptors share in input.json (DPA-3's `repflow`, DPA-2's
//! `repinit` and `repformer`, se_e3_tebd's): the activation (the fitting nets' too), the type
//! embedding's input mode, the update style and how residual vectors start.

use super::error::ConfigError;
use super::keys::Section;
use crate::model::dpa3::UpdateStyle;
use crate::model::{Activation, TebdInputMode};

type Result<T> = std::result::Result<T, ConfigError>;

/// `activation_function` (`default` when absent); `what` names the descriptor in the refusal.
pub(crate) fn activation(sec: &Section, default: &str, what: &str) -> Result<Activation> {
    let name = sec.string_or("activation_function", default)?;
    Activation::parse(&name).ok_or_else(|| {
        ConfigError::unsupported(
            sec.path_of("activation_function"),
            format!("dpw's {what} takes tanh, silu, silut[:c] or linear; found {name:?}"),
        )
    })
}

/// `tebd_input_mode` ("concat" when absent).
pub(crate) fn tebd_input_mode(sec: &Section) -> Result<TebdInputMode> {
    match sec.string_or("tebd_input_mode", "concat")?.as_str() {
        "concat" => Ok(TebdInputMode::Concat),
        "strip" => Ok(TebdInputMode::Strip),
        other => Err(ConfigError::invalid(
            sec.path_of("tebd_input_mode"),
            format!("must be \"concat\" or \"strip\", found {other:?}"),
        )),
    }
}

/// `update_style` and `update_residual_init` ("norm": true), with their defaults.
pub(crate) fn update_keys(
    sec: &Section,
    style_default: &str,
    init_default: &str,
) -> Result<(UpdateStyle, bool)> {
    let style = sec.string_or("update_style", style_default)?;
    let update_style = UpdateStyle::parse(&style).ok_or_else(|| {
        ConfigError::invalid(
            sec.path_of("update_style"),
            format!("must be \"res_avg\", \"res_incr\" or \"res_residual\", found {style:?}"),
        )
    })?;
    let residual_norm = match sec
        .string_or("update_residual_init", init_default)?
        .as_str()
    {
        "norm" => true,
        "const" => false,
        other => {
            return Err(ConfigError::invalid(
                sec.path_of("update_residual_init"),
                format!("must be \"norm\" or \"const\", found {other:?}"),
            ))
        }
    };
    Ok((update_style, residual_norm))
}
