/** The package's version; equal to package.json's (a test checks). */
export const VERSION = '0.0.0-dev';
