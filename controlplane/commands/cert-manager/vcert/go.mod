// A stand-in for github.com/Venafi/vcert/v5, the Venafi client cert-manager's Venafi issuer links: the Go
// module proxy does not serve that module ("This module version is not available"), so go.mod one level up
// replaces it with this one. It declares only what cert-manager's packages name; every Venafi connection
// fails with ErrUnsupported, so a Venafi Issuer is reported not ready while every other issuer works.
module github.com/Venafi/vcert/v5

go 1.24
