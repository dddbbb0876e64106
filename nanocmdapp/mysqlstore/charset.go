package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// subsystemTables are the tables migration 1 creates.
var subsystemTables = []string{"subsystem_profiles", "subsystem_inventory", "subsystem_cmdplans", "subsystem_filevault_keypair"}

// byteColumns are the text columns the storages write as bytes (the
// profile and the plan as the client sent them), by table.
var byteColumns = map[string]string{"subsystem_profiles": "raw_profile", "subsystem_cmdplans": "cmdplan"}

// convertToUTF8MB4 is migration 2: a subsystem table an older database
// made in its default character set (utf8mb3, latin1), which cannot hold
// an emoji, is converted to utf8mb4. Its byte column becomes MEDIUMBLOB
// first, so that what was written as bytes (UTF-8 in a latin1 column) is
// kept as written, not read as latin1 and converted.
func convertToUTF8MB4(ctx context.Context, db *sql.DB) error {
	for _, table := range subsystemTables {
		var collation sql.NullString
		err := db.QueryRowContext(ctx, qTableCollation, table).Scan(&collation)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading the collation of %s: %w", table, err)
		}
		if strings.HasPrefix(collation.String, "utf8mb4") {
			continue
		}
		if col, ok := byteColumns[table]; ok {
			if _, err := db.ExecContext(ctx, "ALTER TABLE "+table+" MODIFY "+col+" MEDIUMBLOB NOT NULL"); err != nil {
				return fmt.Errorf("making %s.%s MEDIUMBLOB: %w", table, col, err)
			}
		}
		if _, err := db.ExecContext(ctx, "ALTER TABLE "+table+" CONVERT TO CHARACTER SET utf8mb4"); err != nil {
			return fmt.Errorf("converting %s (%s) to utf8mb4: %w", table, collation.String, err)
		}
	}
	return nil
}
