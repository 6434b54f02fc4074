//! The configuration file (`Config::from_toml`, what `Config::load` runs on the file's
//! text): any text gives a validated configuration or an error naming the file, never a
//! panic. A configuration printed back as TOML parses to one that prints the same.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use roost::config::Config;

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/roost/roost.toml");
    let Ok(cfg) = Config::from_toml(text, path) else {
        return;
    };
    let printed = toml::to_string(&cfg).expect("a configuration prints as TOML");
    let again = Config::from_toml(&printed, path)
        .unwrap_or_else(|e| panic!("a printed configuration does not load: {e}\n{printed}"));
    assert_eq!(toml::to_string(&again).expect("prints again"), printed);
});
