// Package mdmsim simulates Macs speaking the MDM protocol to an MDM
// server's check-in and command URL (NanoMDM's /mdm), for tests and load
// runs: each device has an identity certificate from the server's CA,
// sent in the header a TLS proxy would set, enrolls (Authenticate, then
// TokenUpdate), and polls (an Idle report, then an answer to each command
// the server hands out until it hands out none).
//
// Devices answer the request types NanoCMD v0.7.1's workflows send with
// the fields those workflows read (respond.go), Acknowledged to any other,
// and can be told to answer Error or NotNow, or to re-authenticate
// (Behavior). A Fleet runs many devices on one HTTP client.
package mdmsim
