PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT, body TEXT, created TEXT DEFAULT (datetime('now')));
INSERT INTO notes VALUES(1,'Packing','Concatenate short examples; mask attention across boundaries.','2024-01-02');
INSERT INTO notes VALUES(2,'Quotes','She said ''hi''; then left.','2024-01-03');
INSERT INTO "notes" ("id","title","body","created") VALUES(3,'Multi
line title','Line one
line two','2024-01-04');
CREATE INDEX notes_title ON notes(title);
COMMIT;
