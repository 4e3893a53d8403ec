//! hybrid in DeePMD-kit's `.yaml` (`DescrptHybrid.serialize`): `type: hybrid` and a `list` of its
//! parts' nodes, each read and written by its part's own registered `.yaml`; a hybrid keeps
//! nothing else (DeePMD-kit's deserialiser takes only `list`).

use anyhow::{ensure, Result};
use serde_yaml_ng::Value;

use crate::model::yaml::{ListYaml, Nodes};
use crate::model::DescriptorSpec;
use crate::yaml_tree::{obj, At};

/// hybrid's entry in the registry.
pub(in crate::model) static YAML: ListYaml = ListYaml {
    parts,
    spec: DescriptorSpec::hybrid,
    write,
};

fn parts<'a>(d: &At<'a>) -> Result<Vec<At<'a>>> {
    d.version(1..=1, None)?;
    let items = d.key("list")?.seq()?;
    ensure!(!items.is_empty(), "{}.list: empty", d.path);
    Ok(items)
}

fn write(parts: Vec<Nodes>) -> Nodes {
    let (files, defs): (Vec<Value>, Vec<Value>) = parts.into_iter().unzip();
    (
        obj! { "@class" => "Descriptor", "@version" => 1, "type" => "hybrid", "list" => files },
        obj! { "type" => "hybrid", "list" => defs },
    )
}
