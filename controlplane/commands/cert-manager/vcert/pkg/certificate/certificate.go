// Package certificate is a stand-in for vcert's (see go.mod): the request types cert-manager fills in.
package certificate

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"time"
)

type CSrOriginOption int

const (
	LocalGeneratedCSR CSrOriginOption = iota
	ServiceGeneratedCSR
	UserProvidedCSR
)

type ChainOption int

const (
	ChainOptionRootLast ChainOption = iota
	ChainOptionRootFirst
	ChainOptionIgnore
)

type CustomFieldType int

const (
	CustomFieldPlain CustomFieldType = iota
	CustomFieldOrigin
)

type CustomField struct {
	Type  CustomFieldType
	Name  string
	Value string
}

type Request struct {
	Subject          pkix.Name
	DNSNames         []string
	FriendlyName     string
	CsrOrigin        CSrOriginOption
	PickupID         string
	ChainOption      ChainOption
	Timeout          time.Duration
	CustomFields     []CustomField
	ValidityDuration *time.Duration
	IssuerHint       string
	csr              []byte
}

func NewRequest(cert *x509.Certificate) *Request {
	return &Request{Subject: cert.Subject, DNSNames: cert.DNSNames}
}

func (r *Request) SetCSR(csr []byte) error { r.csr = csr; return nil }

type PEMCollection struct {
	Certificate string
	PrivateKey  string
	Chain       []string
	CSR         string
}
