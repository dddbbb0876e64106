// The escrow half of this file follows NanoCMD's subsystem/filevault/storage/kv:
//
// Copyright 2023 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanocmd, LICENSE).

package mysqlstore

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"

	"github.com/micromdm/nanocmd/subsystem/filevault/storage"
	"github.com/micromdm/nanocmd/utils/cryptoutil"
	"github.com/smallstep/pkcs7"
)

// As NanoCMD's kv backend makes its keypair.
const (
	keypairName      = "default"
	certCN           = "filevault"
	certValidityDays = 10 * 365
)

// FileVault is NanoCMD's FileVault storage: the PRK escrow keypair in
// MySQL, made once (insert-only, read back) and the same for every replica
// and every restart; decrypted PRKs go to prks (the inventory, as NanoCMD
// keeps them).
type FileVault struct {
	key  *rsa.PrivateKey
	cert *x509.Certificate
	prks storage.PRKStorage
}

var _ storage.FVRotate = (*FileVault)(nil)

// NewFileVault reads the keypair from db, making it first if there is none.
// Two processes starting at once both generate one; the first insert wins
// and both use the winner's.
func NewFileVault(ctx context.Context, db *sql.DB, prks storage.PRKStorage) (*FileVault, error) {
	keyDER, certDER, err := readKeypair(ctx, db)
	if errors.Is(err, sql.ErrNoRows) {
		key, cert, genErr := cryptoutil.SelfSignedRSAKeypair(certCN, certValidityDays)
		if genErr != nil {
			return nil, fmt.Errorf("generating the filevault keypair: %w", genErr)
		}
		if _, err := db.ExecContext(ctx, qInsertKeypair, keypairName, x509.MarshalPKCS1PrivateKey(key), cert.Raw); err != nil {
			return nil, fmt.Errorf("storing the filevault keypair: %w", err)
		}
		keyDER, certDER, err = readKeypair(ctx, db)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the filevault keypair: %w", err)
	}
	fv := &FileVault{prks: prks}
	if fv.key, err = x509.ParsePKCS1PrivateKey(keyDER); err != nil {
		return nil, fmt.Errorf("parsing the filevault key: %w", err)
	}
	if fv.cert, err = x509.ParseCertificate(certDER); err != nil {
		return nil, fmt.Errorf("parsing the filevault certificate: %w", err)
	}
	return fv, nil
}

func readKeypair(ctx context.Context, db *sql.DB) (key, cert []byte, err error) {
	err = db.QueryRowContext(ctx, qKeypair, keypairName).Scan(&key, &cert)
	return key, cert, err
}

// RetrievePRKCertRaw returns the DER certificate devices encrypt PRKs to.
func (s *FileVault) RetrievePRKCertRaw(_ context.Context, _ string) ([]byte, error) {
	return s.cert.Raw, nil
}

// RetrievePRK returns id's escrowed PRK.
func (s *FileVault) RetrievePRK(ctx context.Context, id string) (string, error) {
	return s.prks.RetrievePRK(ctx, id)
}

// EscrowPRK decrypts the PRK CMS and stores the PRK for id.
func (s *FileVault) EscrowPRK(ctx context.Context, id string, cms []byte) error {
	p7, err := pkcs7.Parse(cms)
	if err != nil {
		return fmt.Errorf("parse PRK CMS: %w", err)
	}
	prk, err := p7.Decrypt(s.cert, s.key)
	if err != nil {
		return fmt.Errorf("decrypting PRK CMS: %w", err)
	}
	if err = s.prks.StorePRK(ctx, id, string(prk)); err != nil {
		return fmt.Errorf("store PRK: %w", err)
	}
	return nil
}
