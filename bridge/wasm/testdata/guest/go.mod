module example.com/bridge-wasm-test-guest

go 1.24
