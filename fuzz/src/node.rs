//! The device plugin's node config (`--config`, the chart's `node.config`).

use rocefabric_api::nic_selector::parse_hex_id;
use rocefabric_node_model::config::{Config, duration_text};

use crate::text;

/// `Config::from_yaml`; an accepted config renders to YAML that reads back equal. The text's
/// first line is also read as a duration and a PCI id, the config's scalar parsers.
pub fn node_config(data: &[u8]) {
    let text = text(data);
    match Config::from_yaml(&text) {
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message");
            assert!(!e.metric_label().is_empty());
        }
        Ok(config) => {
            let rendered = match yaml_serde::to_string(&config) {
                Ok(r) => r,
                Err(e) => panic!("a valid config does not render: {e}: {config:?}"),
            };
            match Config::from_yaml(&rendered) {
                Ok(back) => assert_eq!(back, config, "config changed by a round trip:\n{rendered}"),
                Err(e) => panic!("rendered config is refused: {e}\n{rendered}"),
            }
        }
    }
    let line = text.lines().next().unwrap_or_default();
    if let Ok(d) = duration_text::parse(line) {
        let shown = duration_text::format(d);
        assert_eq!(
            duration_text::parse(&shown),
            Ok(d),
            "duration {line:?} shown as {shown:?}"
        );
    }
    if let Some(id) = parse_hex_id(line) {
        assert_eq!(parse_hex_id(&format!("{id:04x}")), Some(id));
        assert_eq!(parse_hex_id(&format!("0x{id:x}")), Some(id));
    }
}
