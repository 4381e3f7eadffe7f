module example.com/bridge-wasm-go-transform

go 1.24
