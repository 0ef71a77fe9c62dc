-- taskq schema v28: inbox message ids compared byte for byte on every server (issue 34 E6).
-- v26 declared `message_id VARCHAR(255)` in `utf8mb4_bin`, a PAD SPACE collation on MySQL 8
-- and MariaDB 10.6+: 'x' and 'x ' compared equal, so a message whose id differs from a
-- recorded one only by trailing spaces was answered `Seen::Again` and dropped. The NO PAD
-- binary collations are server-specific (`utf8mb4_nopad_bin` on MariaDB, `utf8mb4_0900_bin` on
-- MySQL); VARBINARY compares the bytes, with no padding, on both. Ids are at most 255 bytes
-- (`taskq::inbox::MAX_MESSAGE_ID_LEN`), so every stored id fits; no two stored ids collide
-- (the PAD SPACE key allowed no ids that differ only in trailing spaces).
ALTER TABLE taskq_inbox MODIFY message_id VARBINARY(255) NOT NULL;
