// Package control is the bridge's control plane on NATS: a service
// registered with nats.go/micro (name "bridge", so `nats micro ls`, `nats
// micro info bridge` and `nats micro stats bridge` find every instance)
// whose request/reply endpoints report and steer a running bridge, and the
// client the `bridge` commands use to ask them.
//
// Subjects (docs/control.md): "bridge.<name>.status", ".sources" and
// ".reload", which every instance of the bridge answers, and
// "bridge.<name>.pause.<source>", ".resume.<source>", ".snapshot.<source>"
// and ".resync.<source>", which only the instance holding the source
// answers (or the instance a Bridge-Instance header names). Bodies are
// JSON; errors carry the Nats-Service-Error and Nats-Service-Error-Code
// headers and an Error as the body. NATS permissions on these subjects
// authorise per bridge, per action and per source.
//
// The service knows the bridge only through the Bridge interface (app.App
// implements it); the package imports neither the App nor the pipeline.
package control
