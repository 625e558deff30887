package main

// The generated code in bankpb is checked in. To regenerate it, install protoc (Debian:
// apt-get install protobuf-compiler; 3.21.12 made it) and the pinned plugins, then run
// go generate in this directory (in a copy of the example, change the go_package option of
// bankpb/bank.proto to your module's path first):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
//
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative bankpb/bank.proto
